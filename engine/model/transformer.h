// The decoder-only MoE language model: embedding, decoder blocks (attention + dense or
// MoE FFN, pre-norm residual), final norm, LM head and loss, and with model.mtp_depth the
// multi-token prediction modules after them. forward() saves
// activations inside the modules; backward() consumes them and accumulates parameter
// gradients into the ParamStore.
#pragma once

#include <memory>
#include <vector>

#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"
#include "engine/model/attention.h"
#include "moe/moe_layer.h"
#include "moe/router_stats.h"
#include "moe/swiglu_ffn.h"

namespace switchyard {

struct LossParts {
  double cross_entropy = 0;  // mean over target tokens
  double aux_loss = 0;       // unweighted load-balancing loss
  double z_loss = 0;         // unweighted router z-loss (sum over MoE layers)
  double seq_aux_loss = 0;   // unweighted sequence-wise aux loss (sum over MoE layers)
  // Multi-token prediction (model.mtp_depth): the modules' mean cross-entropy, each summed
  // over its targets and divided by the main loss's target count (DeepSeek-V3's 1/T).
  double mtp_loss = 0;
  // cross_entropy + aux_coef * aux_loss + z_coef * z_loss + seq_aux_coef * seq_aux_loss
  // + mtp_coef * mtp_loss
  double total = 0;
  int64_t target_tokens = 0;
};

// The groups a model's layers communicate over (null: one rank). The ParamStore's
// placement must name this process's rank and size in the same groups.
struct ModelParallel {
  // Megatron tensor parallelism: vocabulary-parallel embedding, LM head and loss;
  // column/row-parallel attention and dense FFNs; MoE layers split the tokens.
  Communicator* tensor_parallel = nullptr;
  // The MoE layers hold and run this rank's shard of the experts.
  Communicator* expert_parallel = nullptr;
};

// The keys and values of every layer for one sequence being generated.
struct DecodeCache {
  std::vector<KvCache> layers;
  int64_t length = 0;  // positions cached so far
};

// runtime.max_logits_mb when the recipe leaves it 0.
inline constexpr int64_t kDefaultMaxLogitsMb = 256;

// The layers one pipeline chunk holds: [first_layer, first_layer + num_layers) of the
// model (num_layers -1: to the last). The first chunk also holds the embedding, the last
// the final norm, the LM head and the loss.
struct ModelChunk {
  int first_layer = 0;
  int num_layers = -1;
};

class Transformer {
 public:
  // Registers every parameter of `chunk` in `params` (allocation is the caller's), under
  // the whole model's names and ZeRO units (set_param_hooks); chunks built in depth order
  // may share one ParamStore (a stage's interleaved chunks). A chunk of part of the model
  // needs untied embeddings (recipe validation refuses tied ones with pipeline stages).
  Transformer(const config::Recipe& recipe, ParamStore& params, ModelParallel parallel = {},
              ModelChunk chunk = {});
  ~Transformer();

  // ids, targets: (batch, seq) i32 on the host or on `dev`; a negative target is not
  // scored. Returns the losses; when `logits_out` is given it receives the
  // (batch * seq, vocab) logits on `dev`.
  // doc_starts: undefined, or (batch, seq) i32 on the host for document-aware attention
  // (data.document_attention): where each position's document starts in its window;
  // positions then restart at each document and attention stays inside it.
  // rng: the micro-batch's stream (GShard's random dispatch), left as it was: every MoE
  // layer takes one number per token, layer after layer, so a layer's draws start after
  // the model's earlier MoE layers' (counter + tokens x MoE layers before it), whichever
  // chunk holds it.
  // window_tokens: undefined, or (batch) i32 on the host for padded windows (data.packing
  // PAD): the positions of each window holding text, from its first; the rest are
  // padding, which the MoE layers route nowhere (moe/moe_layer.h).
  // The whole model only (a chunk runs forward_chunk, backward_chunk).
  LossParts forward(Device& dev, const Tensor& ids, const Tensor& targets, bool training,
                    const Rng& rng, Tensor* logits_out = nullptr,
                    const Tensor& doc_starts = Tensor(), const Tensor& window_tokens = Tensor());
  // forward() in evaluation mode that keeps nothing for a backward (evaluation, `eval`,
  // bench balance): each block's tensors go once the next block has its input, the head's
  // after the loss; the MoE layers' last_routing() still describes it. No backward follows.
  LossParts evaluate(Device& dev, const Tensor& ids, const Tensor& targets, const Rng& rng,
                     Tensor* logits_out = nullptr, const Tensor& doc_starts = Tensor(),
                     const Tensor& window_tokens = Tensor());
  // Backward of forward()'s total loss multiplied by `loss_scale` (e.g. 1 / micro-batches).
  // `ce_tokens`, when positive, replaces this batch's target count as the cross-entropy's
  // denominator: the mean count over a step's micro-batches, so that with loss-masked
  // targets the step's loss is the mean over all its targets, in every layout.
  void backward(Device& dev, float loss_scale, double ce_tokens = 0);

  // Pipeline passes: a forward and backward of this chunk (forward() and backward() are
  // the whole model's). Every chunk of a micro-batch takes the same ids, targets, rng,
  // doc_starts, window_tokens and `training` as forward().
  struct ChunkOutput {
    // The chunk's output hidden states, (batch * seq, hidden) in the compute dtype;
    // undefined on the last chunk.
    Tensor hidden;
    // The last chunk only: the cross-entropy parts and the whole model's router losses,
    // from the sums carried to it (a chunk below the last reports none).
    LossParts losses;
    // The routing and loss sums through this chunk: `before` followed by its own MoE
    // layers (RouterStats::all_layers), for the next chunk's forward.
    RoutingSums sums;
  };
  // input: the previous chunk's output hidden states; undefined on the first chunk, which
  // embeds `ids`. The chunk keeps `input` for its backward (as its first layer's saved
  // input): it must not be overwritten before then.
  // before: the previous chunk's output sums (empty on the first chunk): the last chunk's
  // router losses (and, with moe.aux_loss_per_layer false, every router's gradient) are
  // the whole model's only when every chunk passes them on.
  ChunkOutput forward_chunk(Device& dev, const Tensor& input, const Tensor& ids,
                            const Tensor& targets, const Rng& rng,
                            const Tensor& doc_starts = Tensor(), bool training = true,
                            const Tensor& window_tokens = Tensor(),
                            const RoutingSums& before = {});
  // forward_chunk() as evaluate() runs the whole model: evaluation mode, nothing kept.
  ChunkOutput evaluate_chunk(Device& dev, const Tensor& input, const Tensor& ids,
                             const Tensor& targets, const Tensor& doc_starts = Tensor(),
                             const Tensor& window_tokens = Tensor());
  // output_grad: the gradient of the chunk's output (undefined on the last chunk, which
  // starts from the loss). Returns the gradient of its input (undefined on the first
  // chunk). loss_scale and ce_tokens as backward()'s.
  // model_sums: with the all-layer aux loss, below the last chunk, the whole model's sums
  // (the last chunk's router_stats().all_layers after its forward), which every MoE
  // layer's router gradient reads; router_stats().all_layers holds them afterwards.
  Tensor backward_chunk(Device& dev, const Tensor& output_grad, float loss_scale,
                        double ce_tokens = 0, const RoutingSums& model_sums = {});
  bool has_embedding() const { return embed_ != nullptr; }
  const config::Recipe& recipe() const { return recipe_; }
  bool has_head() const { return lm_head_ != nullptr; }

  // One micro-batch's activations: everything a training forward saved for its backward,
  // routing statistics included. Opaque; movable.
  struct Activations {
    Activations();
    ~Activations();
    Activations(Activations&&) noexcept;
    Activations& operator=(Activations&&) noexcept;

   private:
    friend class Transformer;
    struct State;
    std::unique_ptr<State> state_;
  };
  // Moves what the last forward saved out of the model, leaving it as before a forward,
  // so that a pipeline stage can hold several micro-batches between their forward and
  // backward.
  Activations stash_activations();
  // Puts a stash back in place of what the model holds; backward() then runs on it.
  void restore_activations(Activations&& saved);

  // Logits only, for generation: ids (batch, seq) -> (batch * seq, vocab). MoE layers
  // route every token to all of its top-k experts (MoeLayer::infer).
  Tensor logits(Device& dev, const Tensor& ids);

  // Generation with a KV cache, one sequence on the CPU in f32 and one rank: a cache
  // for up to `positions` positions, then decode() runs the tokens of the next positions
  // (the prompt at once, then one token per step), appends their keys and values, and
  // returns the last one's logits (vocab) f32 on the host: logits() of the whole
  // sequence's last row.
  DecodeCache start_decoding(int64_t positions) const;
  // The bytes start_decoding(positions) allocates.
  double decode_cache_bytes(int64_t positions) const;
  Tensor decode(Device& dev, const std::vector<int32_t>& ids, DecodeCache& cache);

  // Hooks around each unit's use of its parameters (ZeRO stages 2 and 3); null: none.
  // Units: 0 the embedding, 1 + i block i, num_layers + 1 the final norm and LM head.
  void set_param_hooks(ParamHooks* hooks) { hooks_ = hooks; }

  // The last forward's routing statistics, of this chunk's MoE layers (RouterStats::merge
  // joins a micro-batch's chunks into the whole model's).
  const RouterStats& router_stats() const { return saved_.stats; }
  bool has_moe() const { return num_moe_layers_ > 0; }
  // The MoE layers in depth order; their last_routing() describes the last forward.
  std::vector<const MoeLayer*> moe_layers() const;

 private:
  struct Block;
  struct MtpModule;
  // What one head's forward keeps for its backward: the main model's, or an MTP module's.
  struct HeadPass {
    Tensor targets;       // on the device
    Tensor targets_host;  // for the loss sums
    Tensor in, rstd, out; // its RMSNorm's input, statistics and output
    Tensor logits;        // kept only when one chunk held all rows (logit_rows)
    Tensor lse;
    int64_t target_tokens = 0;
    double loss_sum = 0;  // the cross-entropy summed over its targets
  };
  // kEval: evaluation mode, saving for a backward; kForwardOnly: evaluation mode, keeping
  // nothing (evaluate()); kGenerate: sampling (logits(), decode()).
  enum class Pass { kTrain, kEval, kForwardOnly, kGenerate };
  // forward(), forward_chunk() and logits().
  ChunkOutput run_chunk(Device& dev, const Tensor& input, const Tensor& ids,
                        const Tensor& targets, Pass pass, const Rng& rng, Tensor* logits_out,
                        const Tensor& doc_starts, const Tensor& window_tokens,
                        const RoutingSums& before = {});
  // A forward's inputs on `dev` (ids, targets, documents, padding) and its routing
  // statistics' start.
  void begin_forward(Device& dev, const Tensor& ids, const Tensor& targets,
                     const Tensor& doc_starts, const Tensor& window_tokens,
                     const RoutingSums& before);
  // The embedding of ids_: (batch * seq, hidden) in the compute dtype.
  Tensor embed(Device& dev);
  // The chunk's blocks on x, each drawing where the model's earlier MoE layers leave rng.
  Tensor blocks_forward(Device& dev, Tensor x, Pass pass, const Rng& rng);
  // Final norm, LM head and cross-entropy of the last block's output, then the MTP modules
  // (training and kEval passes); collects the routing statistics. Returns the
  // cross-entropy parts.
  LossParts head_forward(Device& dev, const Tensor& x, Pass pass, const Rng& rng,
                         Tensor* logits_out);
  // One head on x: `norm`, the LM head and the cross-entropy against h.targets, keeping
  // what its backward reads in h; logits_out as forward()'s.
  void head_pass_forward(Device& dev, Param& norm, HeadPass& h, const Tensor& x,
                         Tensor* logits_out);
  // Its backward with each target's loss weighted by ce_scale: the gradient of x. The
  // head's units must be open for gradients.
  Tensor head_pass_backward(Device& dev, Param& norm, HeadPass& h, float ce_scale);
  // The MTP modules after the main model's last hidden state h, their MoE layers drawing
  // where the model's leave rng: their summed cross-entropies, one per module.
  std::vector<double> mtp_forward(Device& dev, const Tensor& h, Pass pass, const Rng& rng);
  // Their backward, deepest first, each target's loss weighted by ce_scale times the MTP
  // weight over the depth: the gradient of h (undefined when the modules did not run);
  // the embedding's gradients wait in each module's record for the embedding's backward.
  Tensor mtp_backward(Device& dev, float ce_scale);
  // A decoder block of layer `layer`'s names (an MTP module's past the model's layers).
  std::unique_ptr<Block> make_block(ParamStore& params, int layer,
                                    Communicator* expert_parallel);
  std::unique_ptr<MtpModule> make_mtp_module(ParamStore& params, int depth,
                                             Communicator* expert_parallel);
  // Backward of block_forward: dx, the gradient of its output -> its input's; an MoE
  // layer takes its aux-loss probability gradient and the z and sequence-aux weights.
  Tensor block_backward(Device& dev, Block& block, const Tensor& dx, const Tensor& rope,
                        const Tensor& aux_prob_grad, float z_scale, float seq_aux_scale);
  // Targets or ids `shift` positions ahead within each window, -1 (ids: 0) past its end.
  Tensor shifted(const Tensor& host, int64_t shift, int32_t fill) const;
  // The aux and z losses of the collected statistics, and the total.
  void add_routing_losses(LossParts& parts) const;
  // Backward of head_forward: the gradient of the last block's output.
  Tensor head_backward(Device& dev, float loss_scale, double ce_tokens);
  // Backward of blocks_forward: dx, the gradient of the chunk's output -> its input's.
  Tensor blocks_backward(Device& dev, Tensor dx, float loss_scale);
  // The rotary rows of the current forward: rope_for(seq), or with documents doc_rope.
  const Tensor& forward_rope(Device& dev);
  // A block's FFN (dense, or MoE routed as `pass` asks) on its normalised input; an MoE
  // layer adds its routing to `stats`.
  Tensor ffn(Device& dev, Block& block, const Tensor& in, Pass pass, Rng& rng, RouterStats& stats);
  // A block's forward on its input x: saves what its backward reads in the block and its
  // modules, and returns its output.
  Tensor block_forward(Device& dev, Block& block, const Tensor& x, Pass pass, Rng& rng,
                       const Tensor& rope, RouterStats& stats);
  // Full recomputation: the block's forward again from its saved input and random state,
  // with its routing counted apart, so that its backward finds what it reads.
  void recompute_block(Device& dev, Block& block, const Tensor& rope);
  // The rotary table for `seq` positions on `dev`, kept between calls.
  const Tensor& rope_for(Device& dev, int64_t seq);
  // The units the final norm and LM head read (with tied embeddings, also unit 0).
  std::vector<int> head_units() const;
  void acquire(const std::vector<int>& units);
  void release(const std::vector<int>& units);
  // Vocabulary-parallel pieces (tensor_parallel of more than one rank).
  // Host ids shifted into this rank's embedding rows; -1 for another rank's tokens.
  Tensor shard_ids(const Tensor& ids) const;
  // Combines the group's shard log-sum-exps and target logits (all_reduce'd in place):
  // fills h.lse with the whole vocabulary's log-sum-exp and returns the per-token
  // losses (on the host).
  Tensor vocab_parallel_losses(Device& dev, HeadPass& h, const Tensor& shard_lse,
                               Tensor& target_logits);
  // Rows of the LM head whose f32 logits fit in runtime.max_logits_mb (1 to n).
  int64_t logit_rows(int64_t n, int64_t vocab) const;

  config::Recipe recipe_;
  Communicator* tp_;  // null or of size 1
  ParamHooks* hooks_ = nullptr;
  int64_t vocab_start_ = 0;  // this rank's first vocabulary row
  int first_layer_;  // the model layer of blocks_[0]
  Param* embed_ = nullptr;       // null: not the first chunk
  Param* final_norm_ = nullptr;  // null: not the last chunk
  Param* lm_head_ = nullptr;     // aliases embed_ when tied; null: not the last chunk
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<MtpModule>> mtp_;  // depth order; the last chunk only
  int num_moe_layers_ = 0;    // this chunk's
  int model_moe_layers_ = 0;  // the whole model's
  Tensor rope_;
  int64_t rope_seq_ = 0;
  // Everything the model itself saved for backward (its blocks keep theirs), its one
  // record of it.
  struct Saved {
    Tensor doc_starts, doc_rope;  // on the device, with documents (forward's doc_starts)
    std::vector<int32_t> window_tokens;  // forward's window_tokens; empty: no padding
    RouterStats stats;
    int64_t batch = 0, seq = 0;
    Tensor ids;       // shifted into this rank's rows under tensor parallelism
    Tensor ids_host;  // as given, with MTP modules
    HeadPass head;    // the final norm's and the LM head's
  };
  Saved saved_;
};

}  // namespace switchyard
