#include "engine/train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/comm/communicator.h"
#include "core/config/recipe.h"
#include "core/runtime/check.h"
#include "engine/model/transformer.h"
#include "engine/optim/muon.h"
#include "engine/optim/zero.h"
#include "engine/train/evaluation.h"
#include "kernels/exact_grad.h"
#include "moe/capacity.h"

namespace switchyard {

namespace {

// A rank's place in a group, for registering its shards: the model's constructor reads
// only the rank and the size, and a plan never communicates.
class PlacementOnly final : public Communicator {
 public:
  PlacementOnly(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { fail(); }

 protected:
  void all_reduce_sum_f32(float*, int64_t) override { fail(); }
  void all_reduce_sum_f64(double*, int64_t) override { fail(); }
  void all_reduce_sum_i64(int64_t*, int64_t) override { fail(); }
  void reduce_scatter_sum_f32(const float*, float*, int64_t) override { fail(); }
  void all_gather_impl(const Tensor&, Tensor&) override { fail(); }
  void all_to_all_v_impl(const Tensor&, const std::vector<int64_t>&, Tensor&,
                         const std::vector<int64_t>&) override {
    fail();
  }
  std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>&) override {
    fail();
    return {};
  }
  void broadcast_impl(Tensor&, int) override { fail(); }

 private:
  [[noreturn]] static void fail() { SY_CHECK_MSG(false, "a memory plan never communicates"); }
  int rank_;
  int size_;
};

// Bytes alive at one moment of a step: activations, and of them the buffers of an
// expert-parallel exchange and of the messages between pipeline stages.
struct Live {
  double activations = 0;
  double all_to_all = 0;
  double pipeline = 0;
  double total() const { return activations + all_to_all + pipeline; }
  Live operator+(const Live& o) const {
    return {activations + o.activations, all_to_all + o.all_to_all, pipeline + o.pipeline};
  }
};

Live larger(const Live& a, const Live& b) { return a.total() >= b.total() ? a : b; }

// The tensor sizes of one micro-batch on one rank, in elements, as the model code
// allocates them (engine/model/transformer.cc, attention.cc, moe/moe_layer.cc).
struct StepShape {
  double b = 4;         // bytes of a compute-dtype element
  double n = 0;         // tokens of the micro-batch
  double hidden = 0;
  double q = 0;         // this rank's query width (heads / tp x head_dim)
  double kv = 0;        // its key (and value) width
  double heads = 0;     // its heads
  double full_q = 0;    // all heads' widths, for a whole-width q/k norm under tp
  double full_kv = 0;
  double dense_ffn = 0; // this rank's share of a dense FFN's hidden width
  double vocab = 0;     // its vocabulary rows
  double tp = 1;
  bool expert_parallel = false;
  double moe_tokens = 0;  // tokens this rank routes (n / tp)
  double experts = 0;
  double slots = 0;      // routing entries per token: top_k, or every expert's under
                         // expert choice
  double expert_ffn = 0;
  double expert_rows = 0;  // rows this rank's experts run on (balanced routing)
  double sent_rows = 0;    // rows it sends to (and gets back from) the experts
  double shared_ffn = 0;   // this rank's share of the shared experts' hidden width
  bool shared_gate = false;
  bool gshard = false;
  bool qk_norm = false;
  bool qk_head_norm = false;
  bool selective = false;  // train.recompute SELECTIVE
  double logit_rows = 0;
  double rope_dim = 0;     // channels the rotary table covers
  // Latent attention (model.mla; engine/model/mla.cc): its latents' widths, and its
  // per-head widths (query/key, value, the padded operands' D, rotary).
  bool latent = false;
  double q_latent = 0, kv_latent = 0;
  double qk = 0, v_dim = 0, width = 0, rope = 0;
};

// The shape of one pass of `sequences` sequences (a micro-batch, or an evaluation batch).
StepShape step_shape(const config::Recipe& recipe, DType working, int tp, int ep,
                     int64_t sequences) {
  const config::ModelConfig& m = recipe.model();
  const config::MoeConfig& moe = recipe.moe();
  StepShape s;
  s.b = working == DType::kBF16 ? 2 : 4;
  s.n = static_cast<double>(sequences) * recipe.train().seq_len();
  s.hidden = static_cast<double>(m.hidden_size());
  s.tp = tp;
  s.heads = static_cast<double>(m.num_heads()) / tp;
  s.q = s.heads * m.head_dim();
  s.kv = static_cast<double>(m.num_kv_heads()) / tp * m.head_dim();
  s.full_q = static_cast<double>(m.num_heads()) * m.head_dim();
  s.full_kv = static_cast<double>(m.num_kv_heads()) * m.head_dim();
  s.dense_ffn = static_cast<double>(m.ffn_hidden_size()) / tp;
  s.vocab = static_cast<double>(m.vocab_size()) / tp;
  s.qk_norm = m.qk_norm();
  s.qk_head_norm = m.qk_head_norm();
  s.expert_parallel = ep > 1;
  s.moe_tokens = s.n / tp;
  s.experts = moe.num_experts();
  const bool expert_choice = moe.gating() == config::EXPERT_CHOICE;
  s.slots = expert_choice ? s.experts : moe.top_k();
  s.expert_ffn = static_cast<double>(moe.expert_ffn_hidden_size());
  // The permuted buffer has a row per routing entry. A capacity below one drops the
  // assignments past it; with tp the dropped ones are never gathered, without it they
  // keep their rows in the permuted buffer. Expert choice fills every expert to its
  // capacity (moe/capacity.h).
  const double routed = s.moe_tokens * s.slots;
  const double cf = moe.capacity_factor();
  const double choice_capacity = static_cast<double>(expert_choice_capacity(
      moe.capacity_factor(), std::llround(s.moe_tokens), moe.top_k(), moe.num_experts()));
  const double kept = expert_choice ? choice_capacity * s.experts
                      : cf > 0      ? routed * std::min(1.0, cf)
                                    : routed;
  s.sent_rows = tp > 1 ? kept : routed;
  s.expert_rows = ep > 1 ? kept : s.sent_rows;
  if (ep > 1) s.sent_rows = kept;
  s.shared_ffn = static_cast<double>(moe.num_shared_experts()) *
                 static_cast<double>(moe.shared_expert_ffn_hidden_size()) / tp;
  s.shared_gate = moe.num_shared_experts() > 0 && moe.shared_expert_gate();
  s.gshard = moe.gating() == config::GSHARD_TOP2;
  s.selective = recipe.train().recompute() == config::SELECTIVE;
  const int64_t mb = recipe.runtime().max_logits_mb();
  const double budget = static_cast<double>((mb > 0 ? mb : kDefaultMaxLogitsMb) << 20);
  s.logit_rows = std::clamp(std::floor(budget / (s.vocab * 4)), 1.0, std::max(s.n, 1.0));
  const config::MlaConfig& mla = m.mla();
  s.latent = mla.kv_lora_rank() > 0;
  s.rope_dim = s.latent ? mla.qk_rope_head_dim() : m.head_dim();
  s.q_latent = static_cast<double>(mla.q_lora_rank());
  s.kv_latent = static_cast<double>(mla.kv_lora_rank());
  s.rope = mla.qk_rope_head_dim();
  s.qk = static_cast<double>(mla.qk_nope_head_dim()) + mla.qk_rope_head_dim();
  s.v_dim = mla.v_head_dim();
  s.width = std::max(s.qk, s.v_dim);
  return s;
}

// Latent attention keeps its latents before and after their norms, the padded per-head
// q, k, v and core output, the log-sum-exps and the heads' outputs.
double latent_attention_saved(const StepShape& s) {
  return s.n * (2 * (s.q_latent + s.kv_latent) + 4 * s.heads * s.width + s.heads * s.v_dim) * s.b +
         s.n * (2 + s.heads) * 4;
}

// Its backward: the output's gradient (as the heads' and padded), the padded dq, dk, dv,
// dq and its rotary part, kv_b_proj's output gradient, the latents' gradients and dx.
double latent_attention_backward(const StepShape& s) {
  const double per_head = s.v_dim + 4 * s.width + s.qk + s.rope + (s.qk - s.rope + s.v_dim);
  return s.n * (s.heads * per_head + 2 * (s.q_latent + s.kv_latent + s.rope) + s.hidden) * s.b;
}

// Attention keeps q, k, v, its output and log-sum-exps (and a q/k norm's inputs).
double attention_saved(const StepShape& s) {
  if (s.latent) return latent_attention_saved(s);
  double bytes = s.n * (2 * s.q + 2 * s.kv) * s.b + s.n * s.heads * 4;
  if (s.qk_head_norm) bytes += s.n * (s.q + s.kv) * s.b + s.n * (s.heads * 2) * 4;
  if (s.qk_norm)
    bytes += s.n * (s.tp > 1 ? s.full_q + s.full_kv : s.q + s.kv) * s.b + 2 * s.n * 4;
  return bytes;
}

// Attention's core output and log-sum-exps: what selective recomputation does not keep.
double attention_core(const StepShape& s) {
  if (s.latent) return s.n * s.heads * (s.width + s.v_dim) * s.b + s.n * s.heads * 4;
  return s.n * s.q * s.b + s.n * s.heads * 4;
}

// Attention's backward: the output's gradient, dq, dk, dv and dx.
double attention_backward(const StepShape& s) {
  if (s.latent) return latent_attention_backward(s);
  return s.n * (2 * s.q + 2 * s.kv) * s.b + s.n * s.hidden * s.b;
}

double dense_ffn_saved(const StepShape& s) { return s.n * 3 * s.dense_ffn * s.b; }

double dense_ffn_backward(const StepShape& s) {
  return s.n * 3 * s.dense_ffn * s.b + s.n * s.hidden * s.b;
}

// Routing, the permuted rows, the experts' intermediates and outputs, shared experts.
double moe_saved(const StepShape& s) {
  const double t = s.moe_tokens;
  double bytes = (s.b == 2 ? t * s.hidden * 4 : 0) + 2 * t * s.experts * 4 +
                 (s.gshard ? 4 : 3) * t * s.slots * 4 + s.experts * 4;
  bytes += s.expert_rows * (s.hidden + 3 * s.expert_ffn) * s.b + s.sent_rows * s.hidden * s.b;
  if (s.expert_parallel) bytes += s.expert_rows * 4;
  if (s.shared_ffn > 0)
    bytes += s.n * (3 * s.shared_ffn + s.hidden) * s.b + (s.shared_gate ? s.n * s.b : 0);
  return bytes;
}

// The routed experts' gate/up and activation outputs: what selective recomputation does
// not keep.
double experts_hidden(const StepShape& s) { return s.expert_rows * 3 * s.expert_ffn * s.b; }

// MoE backward, over the layer's saved tensors (moe/moe_layer.cc): first the shared
// experts' backward (their gate's gradients and the FFN's), whose intermediates are then
// freed; then the routed experts', whose gradients live until it returns while two
// moments come and go: the exchange back to the routing ranks, then the router's
// gradients (with, under tp, the routed input gradients gathered over the group).
// `recomputed`: the experts' intermediates computed again for the routed part.
Live moe_backward(const StepShape& s, double recomputed) {
  const double t = s.moe_tokens, rows = s.expert_rows, h = s.hidden, x = s.n * h * s.b;
  const double shared = s.n * 3 * s.shared_ffn * s.b;
  const double shared_peak =
      s.shared_ffn > 0 ? x + (s.shared_gate ? x + s.n * s.b : 0) + shared + x : 0;
  const double routed = x - shared + (s.tp > 1 ? t * h * s.b : 0) + s.sent_rows * h * s.b +
                        t * s.slots * 4 + rows * (3 * s.expert_ffn + h) * s.b +
                        (s.expert_parallel ? rows * h * s.b : 0) + recomputed;
  const double sent_back = s.expert_parallel ? s.sent_rows * h * s.b : 0;
  const Live exchange{0, s.expert_parallel ? rows * h * s.b + sent_back : 0};
  const double router_input = std::max({s.tp > 1 ? s.experts * h * 4 : 0.0,
                                        s.b == 2 ? t * h * (4 + s.b) : 0.0,
                                        s.tp > 1 ? x : 0.0});
  const Live router{t * s.experts * 4 + router_input, sent_back};
  return larger(Live{routed} + larger(exchange, router), {shared_peak});
}

// The layers [first, first + layers) of one model chunk, and whether it embeds the
// tokens (the first chunk) and ends in the final norm, head and loss (the last).
struct ChunkSpan {
  int first = 0;
  int layers = 0;
  bool embedding = true;
  bool head = true;
};

// One micro-batch through one chunk: what it keeps from its forward until its backward
// (its stash while other micro-batches run), and the peak of its own forward and
// backward.
struct ChunkPass {
  double stash = 0;
  Live peak;
};

// The peak of one micro-batch through `span`: the end of forward at the head (or the
// output leaving for the next stage), the head's backward, or a layer's backward while
// every earlier layer's saved tensors are still held (each layer keeps its input; the
// last layer's output is the final norm's input). Under recomputation a layer holds
// less until its backward: only its input (FULL), whose backward first runs its forward
// again and holds everything; or all but attention's core and the experts'
// intermediates (SELECTIVE), each computed again just before its backward reads it.
// Below the last chunk, backward starts from the gradient the next stage sent.
ChunkPass chunk_pass(const config::Recipe& recipe, const StepShape& s, const ChunkSpan& span) {
  const int end = span.first + span.layers;
  const double x = s.n * s.hidden * s.b;  // one (tokens, hidden) tensor
  const double block = 4 * x + 2 * s.n * 4 + attention_saved(s);
  const double core_again = s.selective ? attention_core(s) : 0;
  const double experts_again = s.selective ? experts_hidden(s) : 0;
  std::vector<double> saved(span.layers), kept(span.layers);
  int moe_layers = 0;
  for (int i = span.first; i < end; ++i) {
    const bool moe = config::is_moe_layer(recipe, i);
    moe_layers += moe;
    saved[i - span.first] = block + (moe ? moe_saved(s) : dense_ffn_saved(s));
    kept[i - span.first] = config::recomputes_layer(recipe.train(), i - span.first)
                               ? x
                               : saved[i - span.first] - core_again - (moe ? experts_again : 0);
  }
  ChunkPass pass;
  for (double bytes : kept) pass.stash += bytes;
  // The MTP modules after the head (Transformer::mtp_forward): each keeps its block's
  // saved tensors, the embedding of its ids, eh_proj's input (2 x), its block's output,
  // its head's norm output, its logits when one chunk holds them all, and per-token ids,
  // targets, statistics and log-sum-exps; once its backward has run, only its ids and
  // their embedding's gradient, until the embedding's backward.
  const double kept_logits = s.logit_rows >= s.n ? s.logit_rows * s.vocab * 4 : 0;
  double mtp = 0, mtp_after = 0;
  for (int k = 1; span.head && k <= recipe.model().mtp_depth(); ++k) {
    const bool moe = config::is_moe_layer(recipe, recipe.model().num_layers() + k - 1);
    mtp += block + (moe ? moe_saved(s) : dense_ffn_saved(s)) + 5 * x + kept_logits +
           6 * s.n * 4;
    mtp_after += x + s.n * 4;
  }
  // Token ids and targets, the rope table.
  double held = 8 * s.n + recipe.train().seq_len() * s.rope_dim * 4.0 + pass.stash + mtp;
  const double norm = 2 * x + s.n * 4;  // the final norm's input, output and rstd
  if (span.head) {
    const double chunk = s.logit_rows * s.vocab * 4;
    pass.peak.activations = held + norm + 2 * s.n * 4 + chunk + (s.tp > 1 ? 2 * s.n * 4 : 0) +
                            moe_layers * (3 * s.experts + 1) * 4;
    const double dchunk = s.b == 2 ? s.logit_rows * s.vocab * s.b : 0;
    pass.peak = larger(pass.peak, {held + norm + s.n * 4 + x + std::max(chunk + dchunk, x)});
    pass.stash += norm + s.n * 4 + mtp;  // and the log-sum-exps
    if (mtp > 0) {
      // The deepest module's block backward: every module's tensors and the head's still
      // held but the deepest module's head's (its logits and norm output went with its
      // backward, the main head's logits stay), beside the gradient of its output.
      const int deepest = recipe.model().num_layers() + recipe.model().mtp_depth() - 1;
      const Live ffn = config::is_moe_layer(recipe, deepest) ? moe_backward(s, 0)
                                                             : Live{dense_ffn_backward(s)};
      pass.peak = larger(pass.peak, Live{held + norm + s.n * 4 + x} + ffn);
    }
    held += mtp_after - mtp;
  } else {
    pass.peak = {held, 0, x};  // the output, sent to the next stage
  }
  // Through the layers: the gradient flowing down (from the head, or the one received)
  // and the aux-loss gradients stay.
  const Live received{0, 0, span.head ? 0 : x};
  held += (span.head ? x : 0) + moe_layers * s.experts * 4;
  for (int i = end - 1; i >= span.first; --i) {
    const bool moe = config::is_moe_layer(recipe, i);
    const bool whole = config::recomputes_layer(recipe.train(), i - span.first);
    const int j = i - span.first;
    if (whole) held += saved[j] - kept[j];
    const double experts = moe && !whole ? experts_again : 0;
    const Live ffn = moe ? moe_backward(s, experts) : Live{dense_ffn_backward(s)};
    pass.peak = larger(pass.peak, Live{held} + received + ffn);
    const double ffn_saved = (moe ? moe_saved(s) : dense_ffn_saved(s)) - experts;
    pass.peak = larger(pass.peak, Live{held - ffn_saved + 2 * x + attention_backward(s) +
                                       (whole ? 0 : core_again)} +
                                      received);
    held -= whole ? saved[j] : kept[j];
  }
  return pass;
}

// The model chunks pipeline rank `rank` holds (pipeline_schedule.h: local chunk c is
// model chunk c x P + rank), with the recipe's layer split.
std::vector<ChunkSpan> stage_chunks(const config::Recipe& recipe, const PipelineShape& shape,
                                    int rank) {
  const std::vector<int> split = config::pipeline_chunk_layers(recipe);
  std::vector<int> first(split.size() + 1, 0);
  for (size_t k = 0; k < split.size(); ++k) first[k + 1] = first[k] + split[k];
  std::vector<ChunkSpan> chunks;
  for (int c = 0; c < shape.virtual_chunks; ++c) {
    const int k = shape.model_chunk(rank, c);
    chunks.push_back({first[k], split[k], k == 0, k + 1 == shape.num_chunks()});
  }
  return chunks;
}

// The peak of pipeline rank `rank` over a step: one chunk pass at its own peak while the
// schedule holds its other passes whose forward has run and backward has not
// (pipeline_peak_chunk_passes; with V chunks, each counted as the rank's largest stash).
// One stage runs its micro-batches one after another.
Live stage_activation_peak(const config::Recipe& recipe, const StepShape& s,
                           const PipelineShape& shape, int rank) {
  double stash = 0;
  Live peak;
  for (const ChunkSpan& span : stage_chunks(recipe, shape, rank)) {
    const ChunkPass pass = chunk_pass(recipe, s, span);
    stash = std::max(stash, pass.stash);
    peak = larger(peak, pass.peak);
  }
  const int passes = shape.stages > 1 ? pipeline_peak_chunk_passes(shape, rank) : 1;
  return Live{(passes - 1) * stash} + peak;
}

// The peak of one evaluation batch through `span` (Transformer::evaluate): each layer's
// saved tensors go once the next layer has its input, so at most one layer's are held,
// beside its input and output; at the head, the final norm, one chunk of logits and the
// log-sum-exps. Nothing waits for a backward.
Live evaluation_pass_peak(const config::Recipe& recipe, const StepShape& s,
                          const ChunkSpan& span) {
  const double x = s.n * s.hidden * s.b;
  const double held = 8 * s.n + recipe.train().seq_len() * s.rope_dim * 4.0 + x;
  double layer = 0;
  for (int i = span.first; i < span.first + span.layers; ++i) {
    const bool moe = config::is_moe_layer(recipe, i);
    layer = std::max(layer, 4 * x + 2 * s.n * 4 + attention_saved(s) +
                                (moe ? moe_saved(s) : dense_ffn_saved(s)));
  }
  const double norm = 2 * x + s.n * 4;
  const double head = span.head ? norm + s.logit_rows * s.vocab * 4 + 2 * s.n * 4 : 0;
  return Live{held + std::max(layer, head)};
}

// The peak of pipeline rank `rank` while the run evaluates (Live{} when it never does):
// one evaluation batch through each of its chunks in turn.
Live stage_evaluation_peak(const config::Recipe& recipe, DType working, const ShardPlacement& place,
                           const PipelineShape& shape, int rank) {
  const config::TrainConfig& t = recipe.train();
  if (t.eval_interval() <= 0) return {};
  const StepShape s = step_shape(recipe, working, place.tensor_parallel_size,
                                 place.expert_parallel_size,
                                 evaluation_batch_windows(t.seq_len(), t.eval_tokens()));
  Live peak;
  for (const ChunkSpan& span : stage_chunks(recipe, shape, rank))
    peak = larger(peak, evaluation_pass_peak(recipe, s, span));
  return peak;
}

// Which units (ParamStore::begin_unit: 0 the embedding, 1 + i layer i, then the head,
// then the MTP modules) pipeline rank `rank` holds.
std::vector<bool> stage_units(const config::Recipe& recipe, const PipelineShape& shape, int rank) {
  const int layers = recipe.model().num_layers();
  std::vector<bool> held(static_cast<size_t>(layers + 2 + recipe.model().mtp_depth()), false);
  for (const ChunkSpan& span : stage_chunks(recipe, shape, rank)) {
    held[0] = held[0] || span.embedding;
    for (int i = span.first; i < span.first + span.layers; ++i) held[1 + i] = true;
    for (size_t u = layers + 1; u < held.size(); ++u) held[u] = held[u] || span.head;
  }
  return held;
}

bool holds(const std::vector<bool>& units, int unit) {
  return unit >= 0 && unit < static_cast<int>(units.size()) && units[unit];
}

// The rows of dimension 0 each data-parallel replica takes under ZeRO-2/3.
int64_t chunk_rows(const Param& p, int dp_size) { return (p.shape[0] + dp_size - 1) / dp_size; }

double row_bytes(const Param& p) { return 4.0 * shape_numel(p.shape) / p.shape[0]; }

// ZeRO-2/3's whole-layer buffers: a layer's gradients reduce-scattered (with the rows
// this rank receives) while the next layer's are computed; under ZeRO-3 also the values
// of the layer (or, at the head, layers) being used, gathered, and their bf16 copies.
void add_zero_buffers(const ParamStore& params, const std::vector<bool>& held, DType working,
                      int dp_size, int stage, int layers, bool tied, bool accumulating,
                      RankMemory& m) {
  const int last = layers + 1;
  std::vector<double> padded(last + 1), mine(last + 1), gathered(last + 1);
  double largest = 0;
  for (const Param& p : params.params()) {
    if (p.spec.expert || !holds(held, p.unit)) continue;
    // The MTP modules' units open and close inside the head's: counted with it.
    const int unit = std::min(p.unit, last);
    const double whole = chunk_rows(p, dp_size) * dp_size * row_bytes(p);
    largest = std::max(largest, whole);
    gathered[unit] += whole + (working == DType::kBF16 && p.shape.size() >= 2
                                   ? 2.0 * shape_numel(p.shape) : 0);
    if (!p.trainable) continue;
    padded[unit] += whole;
    mine[unit] += chunk_rows(p, dp_size) * row_bytes(p);
  }
  if (stage == 3) {
    double used = gathered[last] + (tied ? gathered[0] : 0);
    for (int u = 0; u < last; ++u) used = std::max(used, gathered[u]);
    m.working_copies += used;
  } else {
    m.working_copies += largest;  // one value gathered back after its update
  }
  // Backward closes units last, layers..1, 0; a tied embedding's stays open throughout.
  // The embedding's reduction is still in flight when the next micro-batch's backward
  // opens the head.
  std::vector<int> order = {last};
  for (int u = layers; u >= 0; --u) order.push_back(u);
  double in_flight = accumulating ? padded[0] + mine[0] : 0;
  double open = padded[last] + (tied ? padded[0] : 0), peak = open + in_flight;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    open -= padded[order[i]];
    in_flight = padded[order[i]] + mine[order[i]];
    if (!(tied && order[i + 1] == 0)) open += padded[order[i + 1]];
    peak = std::max(peak, open + in_flight);
  }
  m.gradient_buckets = peak;
}

// The shards the rank at (pp_index, tp_index, ep_index) of `layout` registers: those of
// the stage's units, ZeRO residency marked.
std::unique_ptr<ParamStore> placement_params(const config::Recipe& recipe, const Layout& layout,
                                             int pp_index, int tp_index, int ep_index,
                                             ShardCache& cache) {
  const ParamStore& whole = cache.whole_model(recipe, layout, tp_index, ep_index);
  auto params = std::make_unique<ParamStore>(whole.placement());
  const std::vector<bool> held = stage_units(recipe, layout.pipeline_shape(), pp_index);
  for (const Param& p : whole.params())
    if (holds(held, p.unit)) params->params().push_back(p);
  const int zero_stage = recipe.parallel().zero_stage();
  if (zero_stage >= 2)
    for (Param& p : params->params()) mark_zero_residency(p, zero_stage);
  return params;
}

int expert_replica_count(const ParamStore& params, int dp_size) {
  const ShardPlacement& place = params.placement();
  return std::max(1, dp_size * place.tensor_parallel_size / place.expert_parallel_size);
}

// ZeRO-1's owner of each parameter among its replicas (empty below stage 1).
std::vector<int> zero_owners(const config::Recipe& recipe, const ParamStore& params,
                             int dp_size) {
  if (recipe.parallel().zero_stage() < 1) return {};
  return assign_owners(params, dp_size, expert_replica_count(params, dp_size));
}

// The pipeline's shape with `dp_size` data-parallel replicas per stage.
PipelineShape recipe_pipeline_shape(const config::Recipe& recipe, int dp_size) {
  Layout layout;
  layout.pipeline_parallel_size = config::effective_pipeline_size(recipe.parallel());
  layout.virtual_pipeline_size = config::effective_virtual_pipeline_size(recipe.parallel());
  layout.pipeline_schedule = config::effective_pipeline_schedule(recipe.parallel());
  const int64_t global = recipe.train().global_batch_size();
  const int64_t micro = recipe.train().micro_batch_size() > 0 ? recipe.train().micro_batch_size()
                                                              : global;
  layout.micro_batches_per_step = std::max<int64_t>(1, global / (int64_t{dp_size} * micro));
  return layout.pipeline_shape();
}

// What the rank needs; `owners` as zero_owners gives them, or empty for an even share.
// `params` may hold more units than pipeline rank `pp_index` does: only its own count.
RankMemory rank_memory(const config::Recipe& recipe, const ParamStore& params, DType working,
                       int dp_size, ReplicaIndex replica, const std::vector<int>& owners,
                       int pp_index) {
  const int stage = recipe.parallel().zero_stage();
  const int expert_replicas = expert_replica_count(params, dp_size);
  const int dense_index = std::max(replica.dense, 0);
  const PipelineShape shape = recipe_pipeline_shape(recipe, dp_size);
  const std::vector<bool> held = stage_units(recipe, shape, pp_index);
  RankMemory m;
  m.pp_index = pp_index;
  for (size_t i = 0; i < params.params().size(); ++i) {
    const Param& p = params.params()[i];
    if (!holds(held, p.unit)) continue;
    const double numel = static_cast<double>(shape_numel(p.shape));
    const double copy = working == DType::kBF16 && p.shape.size() >= 2 ? 2 * numel : 0;
    // fp32 state values per element: AdamW's two moments, or Muon's one momentum.
    const double moments = trained_by_muon(recipe.optimizer(), p) ? 1 : 2;
    // runtime.batch_invariant's exact sums: a whole ledger of each trainable parameter.
    if (recipe.runtime().batch_invariant() && p.trainable)
      m.gradients += 8 * static_cast<double>(exact_grad_ledger_size(shape_numel(p.shape)));
    if (stage >= 2 && !p.spec.expert) {
      const int64_t chunk = chunk_rows(p, dp_size);
      const double rows = static_cast<double>(
          std::clamp<int64_t>(p.shape[0] - dense_index * chunk, 0, chunk));
      m.parameters += stage == 3 ? rows * row_bytes(p) : 4 * numel;
      if (stage == 2) m.working_copies += copy;
      if (p.trainable) m.gradients += chunk * row_bytes(p);
      if (p.trainable) m.optimizer_state += moments * rows * row_bytes(p);
    } else {
      m.parameters += 4 * numel;
      m.working_copies += copy;
      m.gradients += 4 * numel;
      const int index = p.spec.expert ? replica.expert : replica.dense;
      const int share = p.spec.expert ? expert_replicas : dp_size;
      if (p.trainable)
        m.optimizer_state += stage == 0      ? 4 * moments * numel
                             : owners.empty() ? 4 * moments * numel / share
                             : owners[i] < 0 || owners[i] == index ? 4 * moments * numel
                                                                   : 0;
    }
  }
  if (stage >= 2)
    add_zero_buffers(params, held, working, dp_size, stage, recipe.model().num_layers(),
                     recipe.model().tie_embeddings(),
                     recipe.train().global_batch_size() >
                         static_cast<int64_t>(dp_size) * recipe.train().micro_batch_size(),
                     m);
  const ShardPlacement& place = params.placement();
  const Live training = stage_activation_peak(
      recipe,
      step_shape(recipe, working, place.tensor_parallel_size, place.expert_parallel_size,
                 recipe.train().micro_batch_size()),
      shape, pp_index);
  const Live peak =
      larger(training, stage_evaluation_peak(recipe, working, place, shape, pp_index));
  m.activations = peak.activations;
  m.all_to_all = peak.all_to_all;
  m.pipeline_buffers = peak.pipeline;
  return m;
}

// The pipeline stage whose units `params` holds: a trainer's chunks register only theirs
// (the first parameter's unit decides; stage 0 for an empty store).
int stage_of(const config::Recipe& recipe, const ParamStore& params, const PipelineShape& shape) {
  if (params.params().empty()) return 0;
  const int unit = params.params().front().unit;
  for (int r = 0; r < shape.stages; ++r)
    if (holds(stage_units(recipe, shape, r), unit)) return r;
  return 0;
}

}  // namespace

const ParamStore& ShardCache::whole_model(const config::Recipe& recipe, const Layout& layout,
                                          int tp_index, int ep_index) {
  std::unique_ptr<ParamStore>& store = stores_[{tp_index, layout.tensor_parallel_size, ep_index,
                                                layout.expert_parallel_size}];
  if (!store) {
    PlacementOnly tp(tp_index, layout.tensor_parallel_size);
    PlacementOnly ep(ep_index, layout.expert_parallel_size);
    store = std::make_unique<ParamStore>(ShardPlacement{
        tp_index, layout.tensor_parallel_size, ep_index, layout.expert_parallel_size, {}});
    const Transformer model(recipe, *store, {&tp, &ep});
  }
  return *store;
}

RankMemory rank_memory_lower_bound(const config::Recipe& recipe, const ParamStore& params,
                                   DType working, int dp_size, ReplicaIndex replica,
                                   int pp_index) {
  const std::vector<int> owners =
      replica.dense >= 0 ? zero_owners(recipe, params, dp_size) : std::vector<int>();
  const int stage =
      pp_index >= 0 ? pp_index : stage_of(recipe, params, recipe_pipeline_shape(recipe, dp_size));
  return rank_memory(recipe, params, working, dp_size, replica, owners, stage);
}

std::vector<RankMemory> plan_rank_memory(const config::Recipe& recipe, const Layout& layout,
                                         DType working, ShardCache* cache) {
  ShardCache own;
  if (!cache) cache = &own;
  // Ranks differ by their stage, their shards and, under ZeRO, by the parameters they
  // own: each placement's shards and owners are found once.
  struct Placement {
    std::unique_ptr<ParamStore> params;
    std::vector<int> owners;
  };
  std::map<std::tuple<int, int, int>, Placement> placements;
  std::vector<RankMemory> ranks;
  for (int rank = 0; rank < layout.world_size; ++rank) {
    const auto [pp, tp, ep] = std::tuple(layout.pp_index(rank), layout.tp_index(rank),
                                         layout.ep_index(rank));
    auto it = placements.find({pp, tp, ep});
    if (it == placements.end()) {
      Placement p;
      p.params = placement_params(recipe, layout, pp, tp, ep, *cache);
      p.owners = zero_owners(recipe, *p.params, layout.data_parallel_size);
      it = placements.emplace(std::tuple(pp, tp, ep), std::move(p)).first;
    }
    RankMemory m = rank_memory(recipe, *it->second.params, working, layout.data_parallel_size,
                               {layout.dp_index(rank), layout.expert_dp_index(rank)},
                               it->second.owners, pp);
    m.rank = rank;
    m.tp_index = tp;
    m.ep_index = ep;
    ranks.push_back(m);
  }
  return ranks;
}

std::string size_text(double bytes) {
  constexpr double kMiB = 1 << 20;
  constexpr double kGiB = 1 << 30;
  return bytes >= kGiB ? absl::StrFormat("%.2f GiB", bytes / kGiB)
                       : absl::StrFormat("%.1f MiB", bytes / kMiB);
}

std::string describe_rank_memory(const RankMemory& m) {
  return absl::StrFormat(
      "rank %d (stage %d, tp %d, ep %d): at least %s: parameters %s, working copies %s, gradients "
      "%s, gradient buckets %s, optimizer state %s, activations %s, all-to-all buffers %s, "
      "pipeline buffers %s",
      m.rank, m.pp_index, m.tp_index, m.ep_index, size_text(m.total()), size_text(m.parameters),
      size_text(m.working_copies), size_text(m.gradients), size_text(m.gradient_buckets),
      size_text(m.optimizer_state), size_text(m.activations), size_text(m.all_to_all),
      size_text(m.pipeline_buffers));
}

nlohmann::ordered_json rank_memory_json(const RankMemory& m) {
  return {{"rank", m.rank},
          {"tp_index", m.tp_index},
          {"ep_index", m.ep_index},
          {"pp_index", m.pp_index},
          {"total", m.total()},
          {"parameters", m.parameters},
          {"working_copies", m.working_copies},
          {"gradients", m.gradients},
          {"gradient_buckets", m.gradient_buckets},
          {"optimizer_state", m.optimizer_state},
          {"activations", m.activations},
          {"all_to_all", m.all_to_all},
          {"pipeline_buffers", m.pipeline_buffers}};
}

std::string tight_fit_warning(const std::string& device, double bytes, double available) {
  if (available <= 0 || bytes > available || bytes < 0.9 * available) return "";
  return absl::StrFormat(
      "warning: this run needs at least %s on %s, %.0f%% of the %s available there; routing "
      "imbalance, workspaces and fragmentation may not fit (use a smaller micro-batch, or "
      "more ranks)",
      size_text(bytes), device, 100.0 * bytes / available, size_text(available));
}

}  // namespace switchyard
