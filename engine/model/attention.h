// Causal self-attention with grouped KV heads, rotary embeddings, optional q/k/v
// biases (Qwen2-MoE) and optional q/k RMSNorm, over the whole projection (OLMoE) or
// per head (Qwen3-MoE); or, when the recipe sets model.mla, multi-head latent attention
// (engine/model/mla.h), to which every call is handed.
// Tensor parallelism (Megatron): each rank of the group holds heads / tp query heads
// and kv_heads / tp key/value heads (q/k/v column-parallel), and its slice of the
// output projection's columns (row-parallel); the partial outputs, and in backward the
// partial input gradients, are summed over the group. The q/k norm weights are
// replicated: a whole-projection norm gathers the projection's columns over the group
// (forward, and its gradient in backward) and each rank keeps its heads' part; a
// per-head norm runs on the rank's heads and sums its weight gradient over the group.
#pragma once

#include <memory>
#include <string>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/tensor.h"
#include "engine/model/mla.h"
#include "kernels/rope.h"

namespace switchyard {

// One layer's keys and values of the positions generated so far: (positions, kv_heads,
// head_dim) f32 each, on the host, filled from row 0. Latent attention holds its latent
// instead (LatentAttention::decode): k (positions, kv_lora_rank), v (positions,
// qk_rope_head_dim).
struct KvCache {
  Tensor k, v;
};

// The rotary table for `seq` positions of the recipe's attention: over head_dim, or
// latent attention's qk_rope_head_dim, scaled by model.rope_scaling.
Tensor rope_table_for(const config::ModelConfig& model, int64_t seq);
// The recipe's model.rope_scaling as the rotary kernels take it.
YarnScaling yarn_scaling(const config::RopeScaling& scaling);
// The floats one position of a layer's KvCache holds.
int64_t kv_cache_floats_per_position(const config::ModelConfig& model);

// q: (n, heads, D), the queries of positions [past, past + n); k, v: (>= past + n,
// kv_heads, D) the keys and values of positions from 0 -> out: (n, heads, D). The CPU
// kernel's causal attention (kernels/cpu/attention.h) with the queries offset by `past`:
// query i reads keys [0, past + i].
void attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, int64_t past, Tensor& out);

// q or k (batch, seq, heads, D) as the rotary kernels take it: with a row of the table
// per position (documents), one sequence of batch * seq rows.
Tensor rope_view(const Tensor& x, bool per_position);

// Document-aware positions: for each position i of each window, the row of `table` (on
// the host, (seq, head_dim/2, 2)) of its place in its document, i - doc_starts[b, i]
// (host (batch, seq) i32) -> (batch * seq, head_dim/2, 2) on the host.
Tensor document_rope_table(const Tensor& table, const Tensor& doc_starts);

class Attention {
 public:
  // `tensor_parallel` may be null (one rank).
  Attention(ParamStore& params, const std::string& prefix, const config::ModelConfig& model,
            Communicator* tensor_parallel = nullptr);
  // x: (batch * seq, hidden) normalised input; rope: table for `seq` positions. With
  // doc_starts ((batch, seq) i32 on `dev`, kernels/attention.h) each query attends
  // within its document only, and rope has a row per position (document_rope_table).
  Tensor forward(Device& dev, const Tensor& x, int64_t batch, int64_t seq, const Tensor& rope,
                 const Tensor& doc_starts = Tensor());
  Tensor backward(Device& dev, const Tensor& dy, const Tensor& rope);
  // Selective recomputation: forward keeps q, k and v but not the core's output and
  // log-sum-exps; backward computes them again from q, k and v first.
  void set_recompute_core(bool recompute);
  // Drops everything forward saved for backward.
  void discard();
  // Everything forward saved for backward, the module's one record of it (latent
  // attention, when the recipe sets model.mla, keeps its own instead).
  struct Saved {
    int64_t batch = 0, seq = 0;
    Tensor x;           // (n, hidden)
    Tensor q, k, v;     // (batch, seq, heads|kv_heads, head_dim), after RoPE
    Tensor q_pre_norm, k_pre_norm, q_rstd, k_rstd;
    Tensor lse;         // (batch, heads, seq) softmax log-sum-exp, f32
    Tensor doc_starts;  // (batch, seq) i32, or undefined without documents
    Tensor attn_out;    // (n, heads * head_dim), also read by the attention backward
  };
  // The records moved out of the module (left as after discard()) and back, so that
  // several micro-batches can wait for their backward (pipeline schedules).
  struct Stash {
    Saved own;
    LatentAttention::Saved latent;
  };
  Stash stash();
  void restore(Stash&& stash);
  // Generation on the CPU in f32, one rank: x (n, hidden), the normalised inputs of
  // positions [past, past + n); rope: a table covering them. Writes their keys and
  // values into `cache` rows [past, past + n) and attends each position over the cached
  // positions up to itself. Saves nothing for backward.
  Tensor decode(Device& dev, const Tensor& x, int64_t past, const Tensor& rope, KvCache& cache);
  KvCache empty_cache(int64_t positions) const;

 private:
  // Projection (+ bias) (+ q/k norm) for one of q, k, v.
  Tensor project(Device& dev, const Tensor& x, Param* weight, Param* bias, Param* norm,
                 Tensor* pre_norm, Tensor* rstd);
  // The q/k norm of this rank's projection `proj` (n, width); saves its input as the
  // norm saw it (the rows of one head, or the whole projection) and its rstd.
  Tensor normalize(Device& dev, const Tensor& proj, const Param& norm, Tensor& pre_norm,
                   Tensor& rstd);
  // Backward of normalize(): the gradient of this rank's projection; accumulates the
  // norm weight's gradient.
  Tensor normalize_backward(Device& dev, const Tensor& dnormed, Param& norm,
                            const Tensor& pre_norm, const Tensor& rstd);
  // The core: softmax(q k^T) v of the saved q, k, v into its attn_out and lse.
  void core_forward(Device& dev);
  // Backward of project(); accumulates the input gradient into dx.
  void project_backward(Device& dev, Tensor& dproj, Param* weight, Param* bias, Param* norm,
                        const Tensor& pre_norm, const Tensor& rstd, Tensor& dx);

  std::unique_ptr<LatentAttention> latent_;  // set: every call is its
  Communicator* tp_;  // null or of size 1: no reduction
  int64_t heads_, kv_heads_, head_dim_;  // heads of this rank
  float norm_eps_;
  bool per_head_norm_;  // q/k norm per head (else over the whole projection, if any)
  bool recompute_core_ = false;
  Param *wq_, *wk_, *wv_, *wo_;
  Param *q_bias_ = nullptr, *k_bias_ = nullptr, *v_bias_ = nullptr;
  Param *q_norm_ = nullptr, *k_norm_ = nullptr;

  Saved saved_;
};

}  // namespace switchyard
