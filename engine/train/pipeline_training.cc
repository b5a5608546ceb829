#include "engine/train/pipeline_training.h"

#include <bit>
#include <map>
#include <utility>

#include "core/config/recipe.h"

namespace switchyard {

namespace {

// The first layer of each model chunk, and one past the last chunk's.
std::vector<int> chunk_first_layers(const config::Recipe& recipe) {
  std::vector<int> first = {0};
  for (int layers : config::pipeline_chunk_layers(recipe)) first.push_back(first.back() + layers);
  return first;
}

// A layer's statistics as doubles: selections (E), probability sums (E), then tokens,
// top_k, capacity_factor, z_loss, sequence_aux_loss, seq_len.
constexpr int kLayerScalars = 6;

void pack_layer(const RouterStats::Layer& layer, int num_experts, double* out) {
  for (int e = 0; e < num_experts; ++e) {
    out[e] = layer.selections_per_expert[e];
    out[num_experts + e] = layer.prob_sum_per_expert[e];
  }
  double* scalars = out + 2 * num_experts;
  scalars[0] = static_cast<double>(layer.tokens);
  scalars[1] = layer.top_k;
  scalars[2] = layer.capacity_factor;
  scalars[3] = layer.z_loss;
  scalars[4] = layer.sequence_aux_loss;
  scalars[5] = static_cast<double>(layer.seq_len);
}

RouterStats::Layer unpack_layer(const double* in, int num_experts) {
  RouterStats::Layer layer;
  layer.selections_per_expert.assign(in, in + num_experts);
  layer.prob_sum_per_expert.assign(in + num_experts, in + 2 * num_experts);
  const double* scalars = in + 2 * num_experts;
  layer.tokens = static_cast<int64_t>(scalars[0]);
  layer.top_k = static_cast<int>(scalars[1]);
  layer.capacity_factor = static_cast<float>(scalars[2]);
  layer.z_loss = scalars[3];
  layer.sequence_aux_loss = scalars[4];
  layer.seq_len = static_cast<int64_t>(scalars[5]);
  return layer;
}

}  // namespace

bool carries_routing_sums(const config::Recipe& recipe) {
  return moe_layers_before(recipe, recipe.model().num_layers()) > 0;
}

int64_t routing_sums_side_elements(int num_experts) { return 2 * int64_t{num_experts} + 4; }

Tensor pack_routing_sums(const RoutingSums& sums, int num_experts, Device& dev) {
  Tensor packed = Tensor::empty({routing_sums_side_elements(num_experts)}, DType::kI64);
  int64_t* out = packed.data<int64_t>();
  for (int e = 0; e < num_experts; ++e) {
    out[e] = std::bit_cast<int64_t>(sums.selections.empty() ? 0.0 : sums.selections[e]);
    out[num_experts + e] = std::bit_cast<int64_t>(sums.prob_sums.empty() ? 0.0 : sums.prob_sums[e]);
  }
  const double scalars[] = {static_cast<double>(sums.tokens), sums.layer_aux_sum, sums.z_loss,
                            sums.seq_aux_loss};
  for (int i = 0; i < 4; ++i) out[2 * num_experts + i] = std::bit_cast<int64_t>(scalars[i]);
  return packed.to(dev);
}

RoutingSums unpack_routing_sums(const Tensor& side, int num_experts) {
  SY_CHECK_MSG(
      side.dtype() == DType::kI64 && side.numel() == routing_sums_side_elements(num_experts),
      "routing sums side of the wrong size");
  const Tensor host = side.on_host();
  const int64_t* in = host.data<int64_t>();
  RoutingSums sums;
  for (int e = 0; e < num_experts; ++e) {
    sums.selections.push_back(std::bit_cast<double>(in[e]));
    sums.prob_sums.push_back(std::bit_cast<double>(in[num_experts + e]));
  }
  const int64_t* scalars = in + 2 * num_experts;
  sums.tokens = static_cast<int64_t>(std::bit_cast<double>(scalars[0]));
  sums.layer_aux_sum = std::bit_cast<double>(scalars[1]);
  sums.z_loss = std::bit_cast<double>(scalars[2]);
  sums.seq_aux_loss = std::bit_cast<double>(scalars[3]);
  return sums;
}

std::vector<std::unique_ptr<Transformer>> build_model_chunks(const config::Recipe& recipe,
                                                             const Layout& layout,
                                                             int pipeline_rank,
                                                             ParamStore& params,
                                                             ModelParallel parallel) {
  const PipelineShape shape = layout.pipeline_shape();
  const std::vector<int> first = chunk_first_layers(recipe);
  std::vector<std::unique_ptr<Transformer>> chunks;
  for (int c = 0; c < shape.virtual_chunks; ++c) {
    const int k = shape.model_chunk(pipeline_rank, c);
    chunks.push_back(std::make_unique<Transformer>(recipe, params, parallel,
                                                   ModelChunk{first[k], first[k + 1] - first[k]}));
  }
  return chunks;
}

ChunkStages::ChunkStages(Device& dev, const std::vector<std::unique_ptr<Transformer>>& chunks,
                         const std::vector<MicroBatchInput>& inputs, int64_t hidden_size,
                         DType dtype, float loss_scale, double ce_tokens,
                         OverlappedGradReduce* reducer, ForwardDone forward_done)
    : dev_(dev),
      chunks_(chunks),
      inputs_(inputs),
      hidden_size_(hidden_size),
      dtype_(dtype),
      loss_scale_(loss_scale),
      ce_tokens_(ce_tokens),
      reducer_(reducer),
      forward_done_(std::move(forward_done)),
      routing_sums_(carries_routing_sums(chunks.front()->recipe())),
      num_experts_(chunks.front()->recipe().moe().num_experts()),
      stashed_(chunks.size()) {
  for (auto& per_chunk : stashed_) per_chunk.resize(inputs.size());
}

Tensor ChunkStages::side_of(const RoutingSums& sums) const {
  return routing_sums_ ? pack_routing_sums(sums, num_experts_, dev_) : Tensor();
}

StageMessage ChunkStages::forward(int micro_batch, int chunk, const StageMessage& input) {
  const MicroBatchInput& in = inputs_[micro_batch];
  Transformer& model = *chunks_[chunk];
  const RoutingSums before =
      input.side.defined() ? unpack_routing_sums(input.side, num_experts_) : RoutingSums();
  Transformer::ChunkOutput out =
      model.forward_chunk(dev_, input.tensor, in.ids, in.targets, in.rng, in.doc_starts,
                          /*training=*/true, in.window_tokens, before);
  forward_done_(chunk, out.losses, model.router_stats());
  stashed_[chunk][micro_batch] = model.stash_activations();
  return {out.hidden, side_of(out.sums)};
}

StageMessage ChunkStages::backward(int micro_batch, int chunk, const StageMessage& output_grad) {
  Transformer& model = *chunks_[chunk];
  model.restore_activations(std::move(stashed_[chunk][micro_batch]));
  if (reducer_) reducer_->set_reducing(micro_batch + 1 == static_cast<int>(inputs_.size()));
  const RoutingSums model_sums = output_grad.side.defined()
                                     ? unpack_routing_sums(output_grad.side, num_experts_)
                                     : RoutingSums();
  Tensor input_grad =
      model.backward_chunk(dev_, output_grad.tensor, loss_scale_, ce_tokens_, model_sums);
  return {input_grad, side_of(model.router_stats().all_layers)};
}

StageMessage ChunkStages::receive_buffer(TransferKind /*kind*/, int micro_batch, int /*chunk*/) {
  // Activations and their gradients alike: (batch * seq, hidden) in the compute dtype,
  // and the side beside them on the same device.
  const Tensor& ids = inputs_[micro_batch].ids;
  return {Tensor::empty({ids.numel(), hidden_size_}, dtype_, MemoryKind::kActivations, dev_),
          routing_sums_ ? Tensor::empty({routing_sums_side_elements(num_experts_)}, DType::kI64,
                                        MemoryKind::kOther, dev_)
                        : Tensor()};
}

LossParts pipeline_eval_forward(Device& dev, const std::vector<std::unique_ptr<Transformer>>& chunks,
                                const Layout& layout, Communicator& pipeline,
                                int64_t hidden_size, DType dtype, const Tensor& ids,
                                const Tensor& targets, const Tensor& doc_starts,
                                const Tensor& window_tokens) {
  const PipelineShape shape = layout.pipeline_shape();
  const int me = pipeline.rank();
  Tensor input;  // the previous chunk's output, received
  LossParts parts;
  for (int k = 0; k < shape.num_chunks(); ++k) {
    if (shape.rank_of(k) != me) continue;
    if (k > 0) {
      std::vector<Communicator::Message> receive = {
          {false, shape.rank_of(k - 1),
           Tensor::empty({ids.numel(), hidden_size}, dtype, MemoryKind::kActivations, dev)}};
      pipeline.exchange(receive);
      input = receive.front().tensor;
    }
    Transformer::ChunkOutput out =
        chunks[shape.local_chunk(k)]->evaluate_chunk(dev, input, ids, targets, doc_starts,
                                                     window_tokens);
    if (k + 1 < shape.num_chunks()) {
      std::vector<Communicator::Message> send = {{true, shape.rank_of(k + 1), out.hidden}};
      pipeline.exchange(send);
    } else {
      parts = out.losses;
    }
  }
  // The last stage's figures to every stage (the others add zeros).
  std::vector<double> figures = {parts.cross_entropy, static_cast<double>(parts.target_tokens)};
  pipeline.all_reduce_sum(figures.data(), 2);
  LossParts all;
  all.cross_entropy = figures[0];
  all.target_tokens = static_cast<int64_t>(figures[1]);
  all.total = all.cross_entropy;
  return all;
}

int moe_layers_before(const config::Recipe& recipe, int end) {
  int n = 0;
  for (int layer = 0; layer < end; ++layer) n += config::is_moe_layer(recipe, layer) ? 1 : 0;
  return n;
}

int chunk_first_moe_layer(const config::Recipe& recipe, const Layout& layout, int pipeline_rank,
                          int chunk) {
  const std::vector<int> first = chunk_first_layers(recipe);
  return moe_layers_before(recipe,
                           first[layout.pipeline_shape().model_chunk(pipeline_rank, chunk)]);
}

RouterStats gather_pipeline_router_stats(const config::Recipe& recipe, const Layout& layout,
                                         int pipeline_rank,
                                         const std::vector<RouterStats>& mine,
                                         Communicator& pipeline) {
  const int num_experts = recipe.moe().num_experts();
  const int width = 2 * num_experts + kLayerScalars;
  const int total_layers = moe_layers_before(recipe, recipe.model().num_layers());
  // Each rank writes its own layers' rows; the sum over the group holds every layer once.
  std::vector<double> rows(static_cast<size_t>(total_layers) * width, 0.0);
  for (size_t c = 0; c < mine.size(); ++c) {
    const int offset =
        chunk_first_moe_layer(recipe, layout, pipeline_rank, static_cast<int>(c));
    for (size_t l = 0; l < mine[c].layers.size(); ++l)
      pack_layer(mine[c].layers[l], num_experts, &rows[(offset + l) * width]);
  }
  pipeline.all_reduce_sum(rows.data(), static_cast<int64_t>(rows.size()));
  RouterStats all;
  all.num_experts = num_experts;
  all.selections_per_expert.assign(num_experts, 0.0);
  all.prob_sum_per_expert.assign(num_experts, 0.0);
  for (int l = 0; l < total_layers; ++l) {
    all.layers.push_back(unpack_layer(&rows[static_cast<size_t>(l) * width], num_experts));
    const RouterStats::Layer& layer = all.layers.back();
    for (int e = 0; e < num_experts; ++e) {
      all.selections_per_expert[e] += layer.selections_per_expert[e];
      all.prob_sum_per_expert[e] += layer.prob_sum_per_expert[e];
    }
    all.routed_tokens += layer.tokens;
    all.z_loss += layer.z_loss;
  }
  return all;
}

std::vector<std::pair<std::string, Tensor>> gather_pipeline_weights(
    const config::Recipe& recipe, const Layout& layout,
    const std::vector<std::pair<std::string, Tensor>>& mine, Communicator& pipeline) {
  const PipelineShape shape = layout.pipeline_shape();
  const std::vector<int> first = chunk_first_layers(recipe);
  const std::map<std::string, Tensor> held(mine.begin(), mine.end());
  std::vector<std::pair<std::string, Tensor>> whole;
  // Broadcast where the group's collectives take their tensors (no copy on a host
  // communicator) and returned on the host, as `mine` is.
  Device& where = pipeline.tensor_device();
  for (int k = 0; k < shape.num_chunks(); ++k) {
    // The chunk's names and whole shapes, from a model of that chunk on one rank.
    ParamStore names;
    const Transformer chunk(recipe, names, {}, ModelChunk{first[k], first[k + 1] - first[k]});
    const int root = shape.rank_of(k);
    for (const Param& p : names.params()) {
      Tensor value = root == pipeline.rank()
                         ? held.at(p.name).to(where)
                         : Tensor::empty(p.whole_shape, DType::kF32, MemoryKind::kOther, where);
      pipeline.broadcast(value, root);
      whole.emplace_back(p.name, value.on_host());
    }
  }
  return whole;
}

}  // namespace switchyard
