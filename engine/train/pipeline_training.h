// Training with pipeline stages (parallel.pipeline_parallel_size > 1): this rank's
// chunks of the model as the PipelineStages that run_pipeline_step drives, and the
// routing statistics of every stage gathered in the model's layer order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "engine/model/transformer.h"
#include "engine/optim/grad_reducer.h"
#include "engine/parallel/pipeline_executor.h"
#include "engine/parallel/topology.h"
#include "kernels/devices.h"
#include "moe/router_stats.h"

namespace switchyard {

// The model chunks pipeline rank `pipeline_rank` of `layout` holds, in local chunk order:
// model chunk shape.model_chunk(rank, c), its layers from config::pipeline_chunk_layers.
// Each registers its parameters in `params` under the whole model's names.
std::vector<std::unique_ptr<Transformer>> build_model_chunks(const config::Recipe& recipe,
                                                             const Layout& layout,
                                                             int pipeline_rank,
                                                             ParamStore& params,
                                                             ModelParallel parallel);

// One micro-batch's inputs, the same on every stage (only the first embeds the ids, only
// the last scores the targets).
struct MicroBatchInput {
  Tensor ids, targets, doc_starts, window_tokens;  // as Transformer::forward takes them
  Rng rng;  // GShard's draws, the same for every stage (Transformer::forward)
};

// Whether stage messages carry the routing sums (docs/pipeline.md): with MoE layers,
// every activation carries the sums and router losses through its chunk, so that the last
// chunk reports the whole model's losses, and every gradient the whole model's sums,
// which the all-layer aux loss's router gradients read.
bool carries_routing_sums(const config::Recipe& recipe);

// The routing sums as a stage message's side, on `dev`: 2E + 4 doubles (per expert the
// selections, then the probability sums, then the tokens, the balance losses' sum, the
// z-loss and the sequence-wise aux loss) as their bits in i64 elements,
// so that they travel exactly (tensors have no f64). Packed on the host and copied to
// `dev`, where the message's tensor lives: on a GPU by the compute stream, which the
// exchange that sends it waits for.
int64_t routing_sums_side_elements(int num_experts);
Tensor pack_routing_sums(const RoutingSums& sums, int num_experts, Device& dev);
// The sums a side carries, read through the host from its device (on a GPU, once the
// exchange that received it has completed: the copy follows it on the compute stream).
RoutingSums unpack_routing_sums(const Tensor& side, int num_experts);

// One step's passes on this rank's chunks: a forward runs forward_chunk and stashes the
// micro-batch's activations; its backward restores them and runs backward_chunk.
class ChunkStages : public PipelineStages {
 public:
  // Called after every forward with its local chunk, its losses and the chunk's routing
  // statistics.
  using ForwardDone = std::function<void(int, const LossParts&, const RouterStats&)>;
  // `reducer` (null without data parallelism) reduces a chunk's dense gradients over the
  // replicas during its backward of the step's last micro-batch, the last of that chunk
  // in every schedule.
  // Messages carry the routing sums when the model has MoE layers (carries_routing_sums).
  ChunkStages(Device& dev, const std::vector<std::unique_ptr<Transformer>>& chunks,
              const std::vector<MicroBatchInput>& inputs, int64_t hidden_size, DType dtype,
              float loss_scale, double ce_tokens, OverlappedGradReduce* reducer,
              ForwardDone forward_done);

  StageMessage forward(int micro_batch, int chunk, const StageMessage& input) override;
  StageMessage backward(int micro_batch, int chunk, const StageMessage& output_grad) override;
  StageMessage receive_buffer(TransferKind kind, int micro_batch, int chunk) override;

 private:
  // A message's side: the sums, or undefined without them.
  Tensor side_of(const RoutingSums& sums) const;
  Device& dev_;
  const std::vector<std::unique_ptr<Transformer>>& chunks_;
  const std::vector<MicroBatchInput>& inputs_;
  int64_t hidden_size_;
  DType dtype_;
  float loss_scale_;
  double ce_tokens_;
  OverlappedGradReduce* reducer_;
  ForwardDone forward_done_;
  bool routing_sums_;
  int num_experts_;
  // [chunk][micro-batch]: what a forward saved for its backward.
  std::vector<std::vector<Transformer::Activations>> stashed_;
};

// An evaluation forward of one batch through every stage: each model chunk in depth
// order on the pipeline rank that holds it, its output sent to the next chunk's rank. The
// cross-entropy parts, the last stage's, are returned on every rank of `pipeline` (a
// collective over it).
// hidden_size and dtype: the hidden states' width and compute dtype.
LossParts pipeline_eval_forward(Device& dev, const std::vector<std::unique_ptr<Transformer>>& chunks,
                                const Layout& layout, Communicator& pipeline,
                                int64_t hidden_size, DType dtype, const Tensor& ids,
                                const Tensor& targets, const Tensor& doc_starts,
                                const Tensor& window_tokens);

// MoE layers among the model's layers [0, end).
int moe_layers_before(const config::Recipe& recipe, int end);

// The model's MoE-layer index of the first layer of pipeline rank `pipeline_rank`'s local
// chunk `chunk` (0 without pipeline stages).
int chunk_first_moe_layer(const config::Recipe& recipe, const Layout& layout, int pipeline_rank,
                          int chunk);

// Every MoE layer's routing statistics of the whole model, in layer order, from each
// pipeline rank's chunks (`mine`, in local chunk order): a collective over `pipeline`.
RouterStats gather_pipeline_router_stats(const config::Recipe& recipe, const Layout& layout,
                                         int pipeline_rank,
                                         const std::vector<RouterStats>& mine,
                                         Communicator& pipeline);

// The whole model's weights on every rank of `pipeline`, in the model's order: each
// chunk's parameters broadcast from the pipeline rank that holds them (`mine`: this
// rank's whole weights, by name). A collective over `pipeline`.
std::vector<std::pair<std::string, Tensor>> gather_pipeline_weights(
    const config::Recipe& recipe, const Layout& layout,
    const std::vector<std::pair<std::string, Tensor>>& mine, Communicator& pipeline);

}  // namespace switchyard
