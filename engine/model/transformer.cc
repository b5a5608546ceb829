#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/config/recipe.h"
#include "core/runtime/op_clock.h"
#include "engine/parallel/tensor_shards.h"
#include "kernels/cross_entropy.h"
#include "kernels/columns.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "moe/tensor_parallel_sum.h"

namespace switchyard {

namespace {
Tensor activation(Device& dev, const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}

// Registers the parameters that follow in `unit` of the whole model's numbering (the
// units of layers another chunk holds stay empty here).
void enter_unit(ParamStore& params, int unit) {
  SY_CHECK_MSG(params.num_units() <= unit, "ModelChunk: units must be registered in order");
  while (params.num_units() <= unit) params.begin_unit();
}

// The RMSNorms, each timed as a norm (core/runtime/op_clock.h).
void norm_forward(Device& dev, const Tensor& x, const Param& weight, float eps, Tensor& y,
                  Tensor& rstd) {
  const OpScope scope(OpKind::kNorm, OpPass::kForward, dev);
  rmsnorm_forward(dev, x, weight.value, eps, y, rstd);
}

void norm_backward(Device& dev, const Tensor& dy, const Tensor& x, Param& weight,
                   const Tensor& rstd, Tensor& dx) {
  const OpScope scope(OpKind::kNorm, OpPass::kBackward, dev);
  rmsnorm_backward(dev, dy, x, weight.value, rstd, dx, weight.grad);
}
}  // namespace

// Pre-norm block: x + attn(norm(x)), then h + ffn(norm(h)).
struct Transformer::Block {
  Param* attn_norm;
  Param* ffn_norm;
  std::unique_ptr<Attention> attention;
  std::unique_ptr<MoeLayer> moe;
  std::unique_ptr<SwigluFfn> dense;
  float eps;
  int moe_before = 0;  // the model's MoE layers before this one
  // Everything the block itself saved for backward, its one record of it.
  struct Saved {
    Tensor x;  // the input
    // Full recomputation: the forward kept only x, and the random state it started from.
    bool input_only = false;
    // Braced: the record is rebuilt from braced lists, which leave out the rest.
    Rng rng{};
    Tensor attn_rstd{}, attn_in{}, h{}, ffn_rstd{}, ffn_in{};
  };
  Saved saved;
  // Drops what the block and its modules saved, but its input and random state.
  void discard() {
    saved = {.x = std::move(saved.x), .input_only = saved.input_only, .rng = saved.rng};
    attention->discard();
    if (moe) moe->discard();
    if (dense) dense->discard();
  }
  // A forward-only pass (evaluation, bench balance): nothing is kept for a backward, only
  // the routing that MoeLayer::last_routing() reports.
  void discard_after_forward_only() {
    saved = {};
    attention->discard();
    if (moe) moe->discard_keeping_routing();
    if (dense) dense->discard();
  }
  // The block's and its modules' records, moved out (leaving the block as after a
  // backward) and back.
  struct Stash {
    Saved own;
    Attention::Stash attention;
    MoeLayer::Stash moe;
    SwigluFfn::Saved dense;
  };
  Stash stash() {
    return {std::exchange(saved, {}), attention->stash(), moe ? moe->stash() : MoeLayer::Stash{},
            dense ? dense->stash() : SwigluFfn::Saved{}};
  }
  void restore(Stash&& stash) {
    saved = std::move(stash.own);
    attention->restore(std::move(stash.attention));
    if (moe) moe->restore(std::move(stash.moe));
    if (dense) dense->restore(std::move(stash.dense));
  }
};

// A multi-token prediction module (DeepSeek-V3): module k's block takes eh_proj of
// [enorm(the embedding of the ids k ahead), hnorm(module k - 1's output, or the main
// model's last hidden state)]; its own norm (shared_head.norm) then feeds the shared LM
// head against the targets k ahead. Its MoE layer routes as the model's do, its routing
// counted apart from the model's statistics and router losses.
struct Transformer::MtpModule {
  int depth = 0;  // k, 1-based
  int unit = 0;   // its ParamStore unit, after the head's
  Param* enorm = nullptr;
  Param* hnorm = nullptr;
  Param* eh_proj = nullptr;    // (hidden, 2 hidden)
  Param* head_norm = nullptr;  // shared_head.norm
  std::unique_ptr<Block> block;
  // What its forward kept for its backward, its one record of it (braced: after its
  // backward the record is rebuilt with the ids and the embedding's gradient alone).
  struct Saved {
    Tensor ids{};            // the ids k ahead on the device (this rank's rows under tp)
    Tensor emb{}, e_rstd{};  // their embedding, enorm's statistics
    Tensor h{}, h_rstd{};    // the hidden state it started from, hnorm's statistics
    Tensor cat{};            // eh_proj's input
    HeadPass head{};
  };
  Saved saved;
};

// The model's own record and its blocks', in block order.
struct Transformer::Activations::State {
  Saved model;
  std::vector<Block::Stash> blocks;
};

Transformer::Activations::Activations() = default;
Transformer::Activations::~Activations() = default;
Transformer::Activations::Activations(Activations&&) noexcept = default;
Transformer::Activations& Transformer::Activations::operator=(Activations&&) noexcept = default;

Transformer::Activations Transformer::stash_activations() {
  SY_CHECK_MSG(mtp_.empty(), "stash_activations: MTP modules run without pipeline stages");
  Activations saved;
  saved.state_ = std::make_unique<Activations::State>();
  saved.state_->model = std::exchange(saved_, {});
  for (auto& b : blocks_) saved.state_->blocks.push_back(b->stash());
  return saved;
}

void Transformer::restore_activations(Activations&& saved) {
  SY_CHECK_MSG(saved.state_ && saved.state_->blocks.size() == blocks_.size(),
               "restore_activations: not a stash of this model");
  saved_ = std::move(saved.state_->model);
  for (size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->restore(std::move(saved.state_->blocks[i]));
  saved.state_.reset();
}

Transformer::Transformer(const config::Recipe& recipe, ParamStore& params,
                         ModelParallel parallel, ModelChunk chunk)
    : recipe_(recipe),
      tp_(parallel.tensor_parallel && parallel.tensor_parallel->size() > 1
              ? parallel.tensor_parallel
              : nullptr),
      first_layer_(chunk.first_layer) {
  const auto& m = recipe.model();
  const int64_t hidden = m.hidden_size();
  const int end = chunk.num_layers < 0 ? m.num_layers() : chunk.first_layer + chunk.num_layers;
  SY_CHECK_MSG(first_layer_ >= 0 && first_layer_ <= end && end <= m.num_layers(),
               "ModelChunk: layers outside the model");
  const bool whole = first_layer_ == 0 && end == m.num_layers();
  SY_CHECK_MSG(whole || !m.tie_embeddings(), "ModelChunk: tied embeddings need the whole model");
  for (int i = 0; i < m.num_layers(); ++i) model_moe_layers_ += config::is_moe_layer(recipe, i);
  if (first_layer_ == 0) {
    enter_unit(params, 0);
    embed_ = &params.add("model.embed_tokens.weight", {m.vocab_size(), hidden},
                         ShardSpec{.tensor_parallel_dim = 0}, ParamInit::kNormal, m.init_std());
    vocab_start_ = embed_->origin[0];
  }
  for (int i = first_layer_; i < end; ++i) {
    enter_unit(params, 1 + i);
    blocks_.push_back(make_block(params, i, parallel.expert_parallel));
    num_moe_layers_ += blocks_.back()->moe != nullptr;
  }
  if (end < m.num_layers()) return;
  enter_unit(params, m.num_layers() + 1);
  final_norm_ = &params.add("model.norm.weight", {hidden}, ShardSpec{}, ParamInit::kOnes);
  lm_head_ = m.tie_embeddings()
                 ? embed_
                 : &params.add("lm_head.weight", {m.vocab_size(), hidden},
                               ShardSpec{.tensor_parallel_dim = 0}, ParamInit::kNormal,
                               m.init_std());
  vocab_start_ = lm_head_->origin[0];
  for (int k = 1; k <= m.mtp_depth(); ++k) {
    enter_unit(params, m.num_layers() + 1 + k);
    mtp_.push_back(make_mtp_module(params, k, parallel.expert_parallel));
  }
}

std::unique_ptr<Transformer::Block> Transformer::make_block(ParamStore& params, int layer,
                                                            Communicator* expert_parallel) {
  const config::ModelConfig& m = recipe_.model();
  const int64_t hidden = m.hidden_size();
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  auto block = std::make_unique<Block>();
  block->eps = m.norm_eps();
  for (int j = 0; j < layer; ++j) block->moe_before += config::is_moe_layer(recipe_, j);
  block->attn_norm = &params.add(prefix + "input_layernorm.weight", {hidden}, ShardSpec{},
                                 ParamInit::kOnes);
  block->attention = std::make_unique<Attention>(params, prefix + "self_attn.", m, tp_);
  block->ffn_norm = &params.add(prefix + "post_attention_layernorm.weight", {hidden},
                                ShardSpec{}, ParamInit::kOnes);
  const bool selective = recipe_.train().recompute() == config::SELECTIVE;
  block->attention->set_recompute_core(selective);
  if (config::is_moe_layer(recipe_, layer)) {
    block->moe = std::make_unique<MoeLayer>(params, prefix + "mlp.", m, recipe_.moe(),
                                            expert_parallel, tp_);
    block->moe->set_recompute_experts(selective);
  } else {
    block->dense = std::make_unique<SwigluFfn>(params, prefix + "mlp.", hidden,
                                               m.ffn_hidden_size(), m.init_std(), tp_);
  }
  return block;
}

// Module k holds the names of layer num_layers + k - 1, as DeepSeek-V3's checkpoints do.
std::unique_ptr<Transformer::MtpModule> Transformer::make_mtp_module(
    ParamStore& params, int depth, Communicator* expert_parallel) {
  const config::ModelConfig& m = recipe_.model();
  const int64_t hidden = m.hidden_size();
  const int layer = m.num_layers() + depth - 1;
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  auto module = std::make_unique<MtpModule>();
  module->depth = depth;
  module->unit = m.num_layers() + 1 + depth;
  module->enorm = &params.add(prefix + "enorm.weight", {hidden}, ShardSpec{}, ParamInit::kOnes);
  module->hnorm = &params.add(prefix + "hnorm.weight", {hidden}, ShardSpec{}, ParamInit::kOnes);
  module->eh_proj = &params.add(prefix + "eh_proj.weight", {hidden, 2 * hidden}, ShardSpec{},
                                ParamInit::kNormal, m.init_std());
  module->block = make_block(params, layer, expert_parallel);
  module->head_norm = &params.add(prefix + "shared_head.norm.weight", {hidden}, ShardSpec{},
                                  ParamInit::kOnes);
  return module;
}

Transformer::~Transformer() = default;

std::vector<int> Transformer::head_units() const {
  const int last = recipe_.model().num_layers() + 1;
  if (lm_head_ == embed_) return {0, last};
  return {last};
}

void Transformer::acquire(const std::vector<int>& units) {
  if (hooks_)
    for (int u : units) hooks_->acquire(u);
}

void Transformer::release(const std::vector<int>& units) {
  if (hooks_)
    for (int u : units) hooks_->release(u);
}

const Tensor& Transformer::rope_for(Device& dev, int64_t seq) {
  if (!rope_.defined() || rope_seq_ != seq || &rope_.device() != &dev) {
    rope_ = rope_table_for(recipe_.model(), seq).to(dev, MemoryKind::kActivations);
    rope_seq_ = seq;
  }
  return rope_;
}

LossParts Transformer::forward(Device& dev, const Tensor& ids, const Tensor& targets,
                               bool training, const Rng& rng, Tensor* logits_out,
                               const Tensor& doc_starts, const Tensor& window_tokens) {
  SY_CHECK_MSG(has_embedding() && has_head(), "forward: the whole model (a chunk: forward_chunk)");
  return run_chunk(dev, Tensor(), ids, targets, training ? Pass::kTrain : Pass::kEval, rng,
                   logits_out, doc_starts, window_tokens)
      .losses;
}

LossParts Transformer::evaluate(Device& dev, const Tensor& ids, const Tensor& targets,
                                const Rng& rng, Tensor* logits_out, const Tensor& doc_starts,
                                const Tensor& window_tokens) {
  SY_CHECK_MSG(has_embedding() && has_head(),
               "evaluate: the whole model (a chunk: evaluate_chunk)");
  return run_chunk(dev, Tensor(), ids, targets, Pass::kForwardOnly, rng, logits_out, doc_starts,
                   window_tokens)
      .losses;
}

Transformer::ChunkOutput Transformer::evaluate_chunk(Device& dev, const Tensor& input,
                                                     const Tensor& ids, const Tensor& targets,
                                                     const Tensor& doc_starts,
                                                     const Tensor& window_tokens) {
  return run_chunk(dev, input, ids, targets, Pass::kForwardOnly, Rng(0), nullptr, doc_starts,
                   window_tokens);
}

Transformer::ChunkOutput Transformer::forward_chunk(Device& dev, const Tensor& input,
                                                    const Tensor& ids, const Tensor& targets,
                                                    const Rng& rng, const Tensor& doc_starts,
                                                    bool training, const Tensor& window_tokens,
                                                    const RoutingSums& before) {
  return run_chunk(dev, input, ids, targets, training ? Pass::kTrain : Pass::kEval, rng, nullptr,
                   doc_starts, window_tokens, before);
}

const Tensor& Transformer::forward_rope(Device& dev) {
  return saved_.doc_starts.defined() ? saved_.doc_rope : rope_for(dev, saved_.seq);
}

Tensor Transformer::ffn(Device& dev, Block& block, const Tensor& in, Pass pass, Rng& rng,
                        RouterStats& stats) {
  if (!block.moe) {
    const OpScope scope(OpKind::kDenseFfn, OpPass::kForward, dev);
    return block.dense->forward(dev, in);
  }
  if (pass == Pass::kGenerate) return block.moe->infer(dev, in, stats);
  return block.moe->forward(dev, in, pass == Pass::kTrain, rng, stats, saved_.seq,
                            saved_.window_tokens);
}

Tensor Transformer::block_forward(Device& dev, Block& b, const Tensor& x, Pass pass, Rng& rng,
                                  const Tensor& rope, RouterStats& stats) {
  const int64_t n = x.rows();
  const int64_t hidden = x.row_size();
  b.saved.x = x;
  b.saved.attn_in = activation(dev, {n, hidden}, x.dtype());
  b.saved.attn_rstd = activation(dev, {n});
  norm_forward(dev, x, *b.attn_norm, b.eps, b.saved.attn_in, b.saved.attn_rstd);
  Tensor h;
  {
    const OpScope scope(OpKind::kAttention, OpPass::kForward, dev);
    h = b.attention->forward(dev, b.saved.attn_in, saved_.batch, saved_.seq, rope,
                             saved_.doc_starts);
  }
  add_(dev, h, x);
  b.saved.h = h;
  b.saved.ffn_in = activation(dev, {n, hidden}, x.dtype());
  b.saved.ffn_rstd = activation(dev, {n});
  norm_forward(dev, h, *b.ffn_norm, b.eps, b.saved.ffn_in, b.saved.ffn_rstd);
  Tensor f = ffn(dev, b, b.saved.ffn_in, pass, rng, stats);
  add_(dev, f, h);
  return f;
}

void Transformer::recompute_block(Device& dev, Block& b, const Tensor& rope) {
  RouterStats counted_apart;
  counted_apart.begin(dev, b.moe ? 1 : 0);
  Rng replay = b.saved.rng;
  block_forward(dev, b, b.saved.x, Pass::kTrain, replay, rope, counted_apart);
}

void Transformer::begin_forward(Device& dev, const Tensor& ids, const Tensor& targets,
                                const Tensor& doc_starts, const Tensor& window_tokens,
                                const RoutingSums& before) {
  saved_.batch = ids.dim(0);
  saved_.seq = ids.dim(1);
  saved_.window_tokens.clear();
  if (window_tokens.defined()) {
    SY_CHECK_MSG(window_tokens.numel() == saved_.batch,
                 "forward: window_tokens needs one entry per window");
    const int32_t* tokens = window_tokens.data<int32_t>();
    saved_.window_tokens.assign(tokens, tokens + saved_.batch);
  }
  const int64_t n = saved_.batch * saved_.seq;
  saved_.doc_starts =
      doc_starts.defined() ? doc_starts.to(dev, MemoryKind::kActivations) : Tensor();
  saved_.doc_rope =
      doc_starts.defined()
          ? document_rope_table(rope_for(dev, saved_.seq).on_host(), doc_starts)
                .to(dev, MemoryKind::kActivations)
          : Tensor();
  HeadPass& head = saved_.head;
  head.targets_host = targets.reshape({n}).on_host();
  saved_.ids_host = mtp_.empty() ? Tensor() : ids.reshape({n}).on_host();
  if (&ids.device() == &dev && !tp_) {
    saved_.ids = ids.reshape({n});
    head.targets = head.targets_host.to(dev, MemoryKind::kActivations);
  } else {
    // Token ids (this shard's rows of the vocabulary under tp) and targets: one copy.
    Tensor both = activation(cpu_device(), {2, n}, DType::kI32);
    Tensor ids_part = both.slice_rows(0, 1).reshape({n});
    Tensor targets_part = both.slice_rows(1, 2).reshape({n});
    ids_part.copy_from(tp_ && embed_ ? shard_ids(ids.on_host().reshape({n}))
                                  : ids.on_host().reshape({n}));
    targets_part.copy_from(head.targets_host);
    both = both.to(dev, MemoryKind::kActivations);
    saved_.ids = both.slice_rows(0, 1).reshape({n});
    head.targets = both.slice_rows(1, 2).reshape({n});
  }
  saved_.stats.begin(dev, num_moe_layers_, before);
  saved_.stats.model_layers = model_moe_layers_;
}

Tensor Transformer::embed(Device& dev) {
  acquire({0});
  // The compute dtype is the working copies' (ParamStore::allocate): bf16 activations
  // with bf16 weights, f32 otherwise.
  Tensor x = activation(dev, {saved_.ids.numel(), recipe_.model().hidden_size()},
                        embed_->work.dtype());
  const OpScope scope(OpKind::kEmbedding, OpPass::kForward, dev);
  embedding_forward(dev, saved_.ids, embed_->work, x);
  release({0});
  if (tp_) tensor_parallel_sum(dev, *tp_, x);
  return x;
}

Tensor Transformer::blocks_forward(Device& dev, Tensor x, Pass pass, const Rng& rng) {
  const Tensor& rope = forward_rope(dev);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = *blocks_[i];
    const int layer = first_layer_ + static_cast<int>(i);
    acquire({1 + layer});
    b.saved.input_only =
        pass == Pass::kTrain && config::recomputes_layer(recipe_.train(), static_cast<int>(i));
    // The micro-batch's stream where one process's earlier MoE layers leave it (GShard
    // takes one number per token and layer), whichever chunk runs this one.
    b.saved.rng = Rng(rng.seed(), rng.counter() + static_cast<uint64_t>(x.rows()) *
                                                static_cast<uint64_t>(b.moe_before));
    Rng stream = b.saved.rng;
    x = block_forward(dev, b, x, pass, stream, rope, saved_.stats);
    if (pass == Pass::kForwardOnly)
      b.discard_after_forward_only();
    else if (b.saved.input_only)
      b.discard();
    release({1 + layer});
  }
  return x;
}

Transformer::ChunkOutput Transformer::run_chunk(Device& dev, const Tensor& input,
                                                const Tensor& ids, const Tensor& targets,
                                                Pass pass, const Rng& rng, Tensor* logits_out,
                                                const Tensor& doc_starts,
                                                const Tensor& window_tokens,
                                                const RoutingSums& before) {
  begin_forward(dev, ids, targets, doc_starts, window_tokens, before);
  Tensor x = blocks_forward(dev, has_embedding() ? embed(dev) : input, pass, rng);
  ChunkOutput out;
  if (has_head()) {
    out.losses = head_forward(dev, x, pass, rng, logits_out);
    // A forward-only pass keeps nothing for a backward (logits_out holds its own reference).
    if (pass == Pass::kForwardOnly) saved_.head = {};
  } else {
    out.hidden = x;
    saved_.stats.collect();
  }
  add_routing_losses(out.losses);
  out.sums = saved_.stats.all_layers;
  return out;
}

LossParts Transformer::head_forward(Device& dev, const Tensor& x, Pass pass, const Rng& rng,
                                    Tensor* logits_out) {
  std::vector<double> mtp_sums;
  {
    const OpScope scope(OpKind::kHead, OpPass::kForward, dev);
    const std::vector<int> head = head_units();
    acquire(head);
    head_pass_forward(dev, *final_norm_, saved_.head, x, logits_out);
    if (pass == Pass::kTrain || pass == Pass::kEval) mtp_sums = mtp_forward(dev, x, pass, rng);
    release(head);
  }
  saved_.stats.collect();
  LossParts parts;
  parts.target_tokens = saved_.head.target_tokens;
  if (parts.target_tokens == 0) return parts;
  const double tokens = static_cast<double>(parts.target_tokens);
  parts.cross_entropy = saved_.head.loss_sum / tokens;
  for (double sum : mtp_sums) parts.mtp_loss += sum / tokens / static_cast<double>(mtp_.size());
  return parts;
}

void Transformer::head_pass_forward(Device& dev, Param& norm, HeadPass& h, const Tensor& x,
                                    Tensor* logits_out) {
  const int64_t n = x.rows();
  const int64_t vocab = lm_head_->shape[0];  // this rank's vocabulary rows
  h.in = x;
  h.out = activation(dev, {n, x.row_size()}, x.dtype());
  h.rstd = activation(dev, {n});
  norm_forward(dev, x, norm, recipe_.model().norm_eps(), h.out, h.rstd);
  Tensor losses = activation(dev, {n});
  h.lse = activation(dev, {n});
  // Under tensor parallelism each chunk gives this shard's log-sum-exp and target logits;
  // they are combined over the group once all rows are scored.
  Tensor shard_lse = tp_ ? activation(dev, {n}) : h.lse;
  Tensor target_logits = tp_ ? activation(dev, {n}) : Tensor();
  const int64_t rows = logits_out ? n : logit_rows(n, vocab);
  Tensor chunk = activation(dev, {rows, vocab});
  for (int64_t begin = 0; begin < n; begin += rows) {
    const int64_t end = std::min(n, begin + rows);
    Tensor logits = chunk.slice_rows(0, end - begin);
    matmul(dev, h.out.slice_rows(begin, end), false, lm_head_->work, true, logits);
    const Tensor targets = h.targets.slice_rows(begin, end);
    Tensor lse = shard_lse.slice_rows(begin, end);
    if (tp_) {
      Tensor target = target_logits.slice_rows(begin, end);
      cross_entropy_shard_forward(dev, logits, targets,
                                  {vocab_start_, recipe_.model().vocab_size()}, lse, target);
    } else {
      Tensor loss = losses.slice_rows(begin, end);
      cross_entropy_forward(dev, logits, targets, loss, lse);
    }
  }
  // One chunk is kept for backward; more are recomputed there.
  h.logits = rows >= n ? chunk : Tensor();
  if (logits_out) {
    // A copy: in f32 backward turns the kept logits into their gradient in place.
    *logits_out = tp_ ? gather_shards(*tp_, h.logits, 1) : activation(dev, {n, vocab});
    if (!tp_) logits_out->copy_from(h.logits);
  }
  losses = tp_ ? vocab_parallel_losses(dev, h, shard_lse, target_logits) : losses.on_host();
  h.loss_sum = 0;
  h.target_tokens = 0;
  const int32_t* t = h.targets_host.data<int32_t>();
  const float* l = losses.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0) continue;
    h.loss_sum += l[i];
    ++h.target_tokens;
  }
}

Tensor Transformer::shifted(const Tensor& host, int64_t shift, int32_t fill) const {
  const int64_t seq = saved_.seq;
  Tensor out = Tensor::empty({host.numel()}, DType::kI32, MemoryKind::kActivations);
  const int32_t* from = host.data<int32_t>();
  int32_t* to = out.data<int32_t>();
  for (int64_t i = 0; i < host.numel(); ++i) to[i] = i % seq + shift < seq ? from[i + shift] : fill;
  return out;
}

std::vector<double> Transformer::mtp_forward(Device& dev, const Tensor& h, Pass pass,
                                             const Rng& rng) {
  const int64_t n = h.rows(), hidden = h.row_size();
  const float eps = recipe_.model().norm_eps();
  const Tensor& rope = forward_rope(dev);
  std::vector<double> sums;
  Tensor prev = h;
  for (auto& module : mtp_) {
    MtpModule::Saved& s = module->saved;
    acquire({0, module->unit});
    const Tensor ids = shifted(saved_.ids_host, module->depth, 0);
    s.ids = (tp_ ? shard_ids(ids) : ids).to(dev, MemoryKind::kActivations);
    s.emb = activation(dev, {n, hidden}, h.dtype());
    {
      const OpScope scope(OpKind::kEmbedding, OpPass::kForward, dev);
      embedding_forward(dev, s.ids, embed_->work, s.emb);
    }
    if (tp_) tensor_parallel_sum(dev, *tp_, s.emb);
    s.h = prev;
    s.cat = activation(dev, {n, 2 * hidden}, h.dtype());
    Tensor normed = activation(dev, {n, hidden}, h.dtype());
    s.e_rstd = activation(dev, {n});
    norm_forward(dev, s.emb, *module->enorm, eps, normed, s.e_rstd);
    copy_columns(dev, normed, 0, s.cat, 0, hidden);
    s.h_rstd = activation(dev, {n});
    norm_forward(dev, prev, *module->hnorm, eps, normed, s.h_rstd);
    copy_columns(dev, normed, 0, s.cat, hidden, hidden);
    Tensor x = activation(dev, {n, hidden}, h.dtype());
    matmul(dev, s.cat, false, module->eh_proj->work, true, x);
    Block& b = *module->block;
    b.saved.input_only = false;
    b.saved.rng = Rng(rng.seed(), rng.counter() + static_cast<uint64_t>(n) *
                                                static_cast<uint64_t>(b.moe_before));
    Rng stream = b.saved.rng;
    RouterStats apart;
    apart.begin(dev, b.moe ? 1 : 0);
    prev = block_forward(dev, b, x, pass, stream, rope, apart);
    s.head.targets_host = shifted(saved_.head.targets_host, module->depth, -1);
    s.head.targets = s.head.targets_host.to(dev, MemoryKind::kActivations);
    head_pass_forward(dev, *module->head_norm, s.head, prev, nullptr);
    sums.push_back(s.head.loss_sum);
    release({0, module->unit});
  }
  return sums;
}

void Transformer::add_routing_losses(LossParts& parts) const {
  // The sums over every MoE layer so far are the whole model's on its last chunk, which
  // alone reports the router losses (in one process's order); the chunks below carry
  // their layers' terms on to it.
  if (!has_head()) {
    parts.total = parts.cross_entropy;
    return;
  }
  parts.aux_loss = saved_.stats.aux_loss(recipe_.moe().aux_loss_per_layer());
  parts.z_loss = saved_.stats.all_layers.z_loss;
  parts.seq_aux_loss = saved_.stats.all_layers.seq_aux_loss;
  parts.total = parts.cross_entropy + recipe_.moe().aux_loss_coef() * parts.aux_loss +
                recipe_.moe().z_loss_coef() * parts.z_loss +
                recipe_.moe().seq_aux_loss_coef() * parts.seq_aux_loss +
                config::effective_mtp_loss_coef(recipe_.model()) * parts.mtp_loss;
}

Tensor Transformer::shard_ids(const Tensor& ids) const {
  Tensor shifted = Tensor::empty(ids.shape(), DType::kI32, MemoryKind::kActivations);
  const int64_t rows = embed_->shape[0];
  const int32_t* from = ids.data<int32_t>();
  int32_t* to = shifted.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t local = from[i] - vocab_start_;
    to[i] = local >= 0 && local < rows ? static_cast<int32_t>(local) : -1;
  }
  return shifted;
}

int64_t Transformer::logit_rows(int64_t n, int64_t vocab) const {
  const int64_t mb = recipe_.runtime().max_logits_mb();
  const int64_t budget = (mb > 0 ? mb : kDefaultMaxLogitsMb) << 20;
  const int64_t row_bytes = vocab * static_cast<int64_t>(sizeof(float));
  return std::clamp<int64_t>(budget / row_bytes, 1, std::max<int64_t>(n, 1));
}

Tensor Transformer::vocab_parallel_losses(Device& dev, HeadPass& h, const Tensor& shard_lse,
                                          Tensor& target_logits) {
  const int64_t n = shard_lse.rows();
  const int group = tp_->size();
  // Exactly one rank holds each target's logit; the others add zero.
  tp_->all_reduce_sum(target_logits);
  Tensor all_lse = activation(dev, {group, n});
  tp_->all_gather(shard_lse, all_lse);
  // Combined on the host: n values per rank.
  const Tensor all_lse_host = all_lse.on_host();
  const Tensor target_host = target_logits.on_host();
  Tensor lse_host = activation(cpu_device(), {n});
  Tensor losses = activation(cpu_device(), {n});
  const float* part = all_lse_host.data<float>();
  const float* target = target_host.data<float>();
  const int32_t* t = h.targets_host.data<int32_t>();
  float* lse = lse_host.data<float>();
  float* loss = losses.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    double max = part[i];
    for (int r = 1; r < group; ++r) max = std::max<double>(max, part[r * n + i]);
    double sum = 0;
    for (int r = 0; r < group; ++r) sum += std::exp(part[r * n + i] - max);
    lse[i] = static_cast<float>(max + std::log(sum));
    loss[i] = t[i] < 0 ? 0.0f : lse[i] - target[i];
  }
  h.lse.copy_from(lse_host);
  return losses;
}

std::vector<const MoeLayer*> Transformer::moe_layers() const {
  std::vector<const MoeLayer*> layers;
  for (const auto& b : blocks_)
    if (b->moe) layers.push_back(b->moe.get());
  return layers;
}

void Transformer::backward(Device& dev, float loss_scale, double ce_tokens) {
  SY_CHECK_MSG(has_embedding() && has_head(), "backward: the whole model (a chunk: backward_chunk)");
  backward_chunk(dev, Tensor(), loss_scale, ce_tokens);
}

Tensor Transformer::backward_chunk(Device& dev, const Tensor& output_grad, float loss_scale,
                                   double ce_tokens, const RoutingSums& model_sums) {
  if (!has_head() && !recipe_.moe().aux_loss_per_layer()) {
    SY_CHECK_MSG(num_moe_layers_ == 0 || !model_sums.selections.empty(),
                 "backward_chunk: the all-layer aux loss needs the whole model's sums");
    saved_.stats.all_layers = model_sums;
  }
  Tensor dx = blocks_backward(
      dev, has_head() ? head_backward(dev, loss_scale, ce_tokens) : output_grad, loss_scale);
  if (has_embedding()) {
    if (hooks_) hooks_->begin_grads(0);
    {
      const OpScope scope(OpKind::kEmbedding, OpPass::kBackward, dev);
      embedding_backward(dev, saved_.ids, dx, embed_->grad);
      for (auto& module : mtp_)
        if (module->saved.emb.defined())
          embedding_backward(dev, module->saved.ids, module->saved.emb, embed_->grad);
    }
    if (hooks_) hooks_->end_grads(0);
    dx = Tensor();
  }
  for (auto& module : mtp_) module->saved = {};
  saved_.ids = saved_.ids_host = Tensor();
  saved_.head = {};
  return dx;
}

Tensor Transformer::head_backward(Device& dev, float loss_scale, double ce_tokens) {
  const std::vector<int> head = head_units();
  acquire(head);
  if (hooks_)
    for (int u : head) hooks_->begin_grads(u);
  const int64_t targets = saved_.head.target_tokens;
  const double denominator = ce_tokens > 0 ? ce_tokens : static_cast<double>(targets);
  const float ce_scale = targets ? loss_scale / static_cast<float>(denominator) : 0.0f;
  // The modules first: their heads add to the LM head's gradient while it is open.
  const Tensor dmtp = mtp_backward(dev, ce_scale);
  Tensor dx;
  {
    const OpScope scope(OpKind::kHead, OpPass::kBackward, dev);
    dx = head_pass_backward(dev, *final_norm_, saved_.head, ce_scale);
  }
  if (dmtp.defined()) add_(dev, dx, dmtp);
  release(head);
  // A tied embedding's gradient is complete only after the embedding's backward.
  if (hooks_) hooks_->end_grads(head.back());
  return dx;
}

Tensor Transformer::head_pass_backward(Device& dev, Param& norm, HeadPass& h, float ce_scale) {
  const int64_t n = h.in.rows();
  const int64_t hidden = h.in.row_size();
  // In f32 the logits buffer becomes its own gradient; in bf16 the gradient is a bf16
  // operand of the LM head's products.
  const DType dtype = h.out.dtype();
  Tensor dnorm = activation(dev, {n, hidden}, dtype);
  // Forward kept the logits when one chunk held them all; otherwise each chunk's logits
  // are recomputed from the saved norm output.
  const int64_t vocab = lm_head_->shape[0];
  const int64_t rows = h.logits.defined() ? n : logit_rows(n, vocab);
  Tensor chunk = h.logits.defined() ? h.logits : activation(dev, {rows, vocab});
  Tensor dchunk = dtype == DType::kF32 ? chunk : activation(dev, {rows, vocab}, dtype);
  for (int64_t begin = 0; begin < n; begin += rows) {
    const int64_t end = std::min(n, begin + rows);
    const Tensor in = h.out.slice_rows(begin, end);
    Tensor logits = chunk.slice_rows(0, end - begin);
    if (!h.logits.defined()) matmul(dev, in, false, lm_head_->work, true, logits);
    Tensor dlogits = dchunk.slice_rows(0, end - begin);
    cross_entropy_backward(dev, logits, h.targets.slice_rows(begin, end),
                           h.lse.slice_rows(begin, end), ce_scale, dlogits,
                           {vocab_start_, recipe_.model().vocab_size()});
    matmul(dev, dlogits, true, in, false, lm_head_->grad, 1.0f, 1.0f);
    Tensor d = dnorm.slice_rows(begin, end);
    matmul(dev, dlogits, false, lm_head_->work, false, d);
  }
  chunk = dchunk = Tensor();
  if (tp_) tensor_parallel_sum(dev, *tp_, dnorm);
  Tensor dx = activation(dev, {n, hidden}, dtype);
  norm_backward(dev, dnorm, h.in, norm, h.rstd, dx);
  h.logits = h.lse = h.in = h.out = h.rstd = Tensor();
  return dx;
}

Tensor Transformer::mtp_backward(Device& dev, float ce_scale) {
  if (mtp_.empty() || !mtp_.front()->saved.cat.defined()) return Tensor();
  const float scale = ce_scale * config::effective_mtp_loss_coef(recipe_.model()) /
                      static_cast<float>(mtp_.size());
  const Tensor& rope = forward_rope(dev);
  const int64_t hidden = recipe_.model().hidden_size();
  const Tensor no_aux = Tensor::zeros({recipe_.moe().num_experts()}, DType::kF32,
                                      MemoryKind::kActivations, dev);
  Tensor dnext;  // the gradient of the deeper module's input hidden state
  for (size_t k = mtp_.size(); k-- > 0;) {
    MtpModule& module = *mtp_[k];
    MtpModule::Saved& s = module.saved;
    acquire({module.unit});
    if (hooks_) hooks_->begin_grads(module.unit);
    Tensor dout;
    {
      const OpScope scope(OpKind::kHead, OpPass::kBackward, dev);
      dout = head_pass_backward(dev, *module.head_norm, s.head, scale);
    }
    if (dnext.defined()) add_(dev, dout, dnext);
    const Tensor dx = block_backward(dev, *module.block, dout, rope, no_aux, 0.0f, 0.0f);
    const int64_t n = dx.rows();
    matmul(dev, dx, true, s.cat, false, module.eh_proj->grad, 1.0f, 1.0f);
    Tensor dcat = activation(dev, {n, 2 * hidden}, dx.dtype());
    matmul(dev, dx, false, module.eh_proj->work, false, dcat);
    Tensor dnormed = activation(dev, {n, hidden}, dx.dtype());
    copy_columns(dev, dcat, hidden, dnormed, 0, hidden);
    dnext = activation(dev, {n, hidden}, dx.dtype());
    norm_backward(dev, dnormed, s.h, *module.hnorm, s.h_rstd, dnext);
    copy_columns(dev, dcat, 0, dnormed, 0, hidden);
    // The embedding's gradient waits in s.emb for the embedding's backward.
    Tensor demb = activation(dev, {n, hidden}, dx.dtype());
    norm_backward(dev, dnormed, s.emb, *module.enorm, s.e_rstd, demb);
    s = {.ids = std::move(s.ids), .emb = std::move(demb)};
    release({module.unit});
    if (hooks_) hooks_->end_grads(module.unit);
  }
  return dnext;
}

Tensor Transformer::blocks_backward(Device& dev, Tensor dx, float loss_scale) {
  const Tensor& rope = forward_rope(dev);
  const bool per_layer = recipe_.moe().aux_loss_per_layer();
  const double aux_scale = recipe_.moe().aux_loss_coef() * loss_scale;
  const float z_scale = recipe_.moe().z_loss_coef() * loss_scale;
  const float seq_aux_scale = recipe_.moe().seq_aux_loss_coef() * loss_scale;
  // Every MoE layer's aux-loss gradient (E values), one upload for the whole backward.
  const int64_t num_moe = static_cast<int64_t>(saved_.stats.layers.size());
  Tensor aux_grads_host = activation(cpu_device(), {num_moe, recipe_.moe().num_experts()});
  for (int64_t l = 0; l < num_moe; ++l) {
    const std::vector<float> g = saved_.stats.aux_loss_prob_gradient(aux_scale, per_layer, l);
    std::copy(g.begin(), g.end(), aux_grads_host.data<float>() + l * aux_grads_host.row_size());
  }
  const Tensor aux_grads = aux_grads_host.to(dev, MemoryKind::kActivations);
  int64_t moe_index = num_moe;

  for (size_t i = blocks_.size(); i-- > 0;) {
    Block& b = *blocks_[i];
    const int unit = 1 + first_layer_ + static_cast<int>(i);
    acquire({unit});
    if (hooks_) hooks_->begin_grads(unit);
    Tensor aux_prob_grad;
    if (b.moe) {
      --moe_index;
      aux_prob_grad =
          aux_grads.slice_rows(moe_index, moe_index + 1).reshape({aux_grads.row_size()});
    }
    dx = block_backward(dev, b, dx, rope, aux_prob_grad, z_scale, seq_aux_scale);
    release({unit});
    if (hooks_) hooks_->end_grads(unit);
  }
  return dx;
}

Tensor Transformer::block_backward(Device& dev, Block& b, const Tensor& dx, const Tensor& rope,
                                  const Tensor& aux_prob_grad, float z_scale,
                                  float seq_aux_scale) {
  const int64_t n = dx.rows();
  const int64_t hidden = dx.row_size();
  if (b.saved.input_only) recompute_block(dev, b, rope);
  // dx is the gradient w.r.t. the block output f + h.
  Tensor dffn_in;
  if (b.moe) {
    dffn_in = b.moe->backward(dev, dx, aux_prob_grad, z_scale, seq_aux_scale);
  } else {
    const OpScope scope(OpKind::kDenseFfn, OpPass::kBackward, dev);
    dffn_in = b.dense->backward(dev, dx);
  }
  Tensor dh = activation(dev, {n, hidden}, dx.dtype());
  norm_backward(dev, dffn_in, b.saved.h, *b.ffn_norm, b.saved.ffn_rstd, dh);
  add_(dev, dh, dx);
  Tensor dattn_in;
  {
    const OpScope scope(OpKind::kAttention, OpPass::kBackward, dev);
    dattn_in = b.attention->backward(dev, dh, rope);
  }
  Tensor dprev = activation(dev, {n, hidden}, dx.dtype());
  norm_backward(dev, dattn_in, b.saved.x, *b.attn_norm, b.saved.attn_rstd, dprev);
  add_(dev, dprev, dh);
  b.saved = {};
  return dprev;
}

Tensor Transformer::logits(Device& dev, const Tensor& ids) {
  Tensor targets = Tensor::empty(ids.shape(), DType::kI32, MemoryKind::kActivations);
  int32_t* t = targets.data<int32_t>();
  for (int64_t i = 0; i < targets.numel(); ++i) t[i] = -1;
  SY_CHECK_MSG(has_embedding() && has_head(), "logits: the whole model, not a chunk");
  Tensor out;
  run_chunk(dev, Tensor(), ids, targets, Pass::kGenerate, Rng(0), &out, Tensor(), Tensor());
  saved_.head = {};
  return out;
}

DecodeCache Transformer::start_decoding(int64_t positions) const {
  DecodeCache cache;
  for (const auto& b : blocks_) cache.layers.push_back(b->attention->empty_cache(positions));
  return cache;
}

double Transformer::decode_cache_bytes(int64_t positions) const {
  return static_cast<double>(sizeof(float)) * static_cast<double>(blocks_.size()) *
         static_cast<double>(positions) *
         static_cast<double>(kv_cache_floats_per_position(recipe_.model()));
}

Tensor Transformer::decode(Device& dev, const std::vector<int32_t>& ids, DecodeCache& cache) {
  SY_CHECK_MSG(has_embedding() && has_head(), "decode: the whole model, not a chunk");
  SY_CHECK_MSG(!dev.is_cuda() && !tp_ && !hooks_ && embed_->work.dtype() == DType::kF32,
               "decode runs on the CPU in f32 on one rank");
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t hidden = recipe_.model().hidden_size();
  const int64_t positions = cache.layers.empty() ? 0 : cache.layers[0].k.dim(0);
  SY_CHECK_MSG(n > 0 && cache.length + n <= positions, "decode: the cache is full");
  const Tensor& rope = rope_for(dev, positions);
  Tensor id_tensor = activation(dev, {n}, DType::kI32);
  std::copy(ids.begin(), ids.end(), id_tensor.data<int32_t>());
  saved_.stats.begin(dev, static_cast<int>(moe_layers().size()));
  Tensor x = activation(dev, {n, hidden});
  embedding_forward(dev, id_tensor, embed_->work, x);
  Rng unused;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& b = *blocks_[i];
    Tensor attn_in = activation(dev, {n, hidden});
    Tensor rstd = activation(dev, {n});
    rmsnorm_forward(dev, x, b.attn_norm->value, b.eps, attn_in, rstd);
    Tensor h = b.attention->decode(dev, attn_in, cache.length, rope, cache.layers[i]);
    add_(dev, h, x);
    Tensor ffn_in = activation(dev, {n, hidden});
    rmsnorm_forward(dev, h, b.ffn_norm->value, b.eps, ffn_in, rstd);
    x = ffn(dev, b, ffn_in, Pass::kGenerate, unused, saved_.stats);
    add_(dev, x, h);
  }
  cache.length += n;
  const Tensor last = x.slice_rows(n - 1, n);
  Tensor normed = activation(dev, {1, hidden});
  Tensor rstd = activation(dev, {1});
  rmsnorm_forward(dev, last, final_norm_->value, recipe_.model().norm_eps(), normed, rstd);
  Tensor out = activation(dev, {1, lm_head_->shape[0]});
  matmul(dev, normed, false, lm_head_->work, true, out);
  return out.reshape({lm_head_->shape[0]});
}

}  // namespace switchyard
