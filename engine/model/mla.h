// Multi-head latent attention (DeepSeek-V2/V3; recipe model.mla, docs/mla.md).
//
//   queries   q = W_qb rmsnorm(W_qa x)          (or q = W_q x without a query latent)
//   latent    [c, k_rot] = W_kva x;  [k_nope, v] = W_kvb rmsnorm(c)
//   per head  query [q_nope, rope(q_rot)], key [k_nope, rope(k_rot)] with one rotary key
//             shared by every head, value v; causal softmax at scale 1/sqrt(nope + rope).
//
// The core runs the engine's attention kernel on per-head operands of one width D =
// max(nope + rope, v), zero-padded (zero channels add nothing to a score, and a zero
// value channel gives a zero output channel), with the queries scaled by sqrt(D) x the
// softmax scale so that the kernel's 1/sqrt(D) gives that scale.
//
// Tensor parallelism over heads: q_b_proj (or q_proj) and kv_b_proj are column-parallel,
// o_proj row-parallel; the down-projections and their norms are replicated, so each rank
// computes the latents whole. In backward the latents' gradients (one buffer) are summed
// over the group before the norms, so every rank finds the whole gradient of every
// replicated parameter and of the input.
#pragma once

#include <string>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "core/runtime/tensor.h"

namespace switchyard {

struct KvCache;

// The softmax scale of the recipe's latent attention: 1 / sqrt(qk_nope + qk_rope), times
// YaRN's m(factor, mscale_all_dim)^2 when model.rope_scaling sets mscale_all_dim.
float mla_softmax_scale(const config::ModelConfig& model);

class LatentAttention {
 public:
  // `tensor_parallel` may be null (one rank).
  LatentAttention(ParamStore& params, const std::string& prefix, const config::ModelConfig& model,
                  Communicator* tensor_parallel);
  // x: (batch * seq, hidden) normalised input; rope: (>= seq, rope_dim / 2, 2) table.
  // With doc_starts, as Attention::forward: each query attends within its document, and
  // rope has a row per position (document_rope_table).
  Tensor forward(Device& dev, const Tensor& x, int64_t batch, int64_t seq, const Tensor& rope,
                 const Tensor& doc_starts = Tensor());
  Tensor backward(Device& dev, const Tensor& dy, const Tensor& rope);
  // As Attention::decode; the cache holds each position's normalised key/value latent
  // (cache.k, kv_lora_rank floats) and rotated rotary key (cache.v, qk_rope_head_dim),
  // and the heads attend over them in latent space (attend_latent).
  Tensor decode(Device& dev, const Tensor& x, int64_t past, const Tensor& rope, KvCache& cache);
  KvCache empty_cache(int64_t positions) const;
  // Selective recomputation: forward keeps the per-head operands but not the core's
  // output and log-sum-exps; backward computes them again first.
  void set_recompute_core(bool recompute) { recompute_core_ = recompute; }
  // Drops everything forward saved for backward.
  void discard();
  // Everything forward saved for backward, the module's one record of it.
  struct Saved {
    int64_t batch = 0, seq = 0;
    Tensor x;                        // (n, hidden)
    Tensor cq, cq_rstd, cq_normed;   // query latent (n, q_rank) before and after its norm
    Tensor c, c_rstd, c_normed;      // key/value latent (n, kv_rank)
    Tensor q_full, k_full, v_full;   // (batch, seq, heads, D)
    Tensor out_full, lse;            // the core's output (batch, seq, heads, D) and lse
    Tensor attn_out;                 // (n, heads * v_dim)
    Tensor doc_starts;               // (batch, seq) i32, or undefined without documents
  };
  // The record moved out (leaving the module as after discard()) and back, so that
  // several micro-batches can wait for their backward (pipeline schedules).
  Saved stash();
  void restore(Saved&& saved);

 private:
  // The per-head queries (batch, seq, heads, D) of x: [q_nope, rope(q_rot)], zero-padded
  // and scaled by q_scale_; saves the query latent for backward.
  Tensor query_heads(Device& dev, const Tensor& x, int64_t batch, int64_t seq, const Tensor& rope);
  // The key/value latent of x: saves c, c_rstd and c_normed (n, kv_rank) and returns
  // the rotated rotary key (n, rope).
  Tensor key_latent(Device& dev, const Tensor& x, int64_t batch, int64_t seq, const Tensor& rope);
  // The per-head keys and values k_full, v_full (batch, seq, heads, D) of the normalised
  // latent (n, kv_rank) and the rotary key (n, rope) every head shares.
  void key_value_heads(Device& dev, const Tensor& c_normed, const Tensor& k_rot, int64_t batch,
                       int64_t seq);
  // Generation's attention of the queries q_rows (n, heads * D) of positions [past, past +
  // n) over the cached latents of positions [0, past + n), kv_b_proj absorbed: each head's
  // position-free query goes through its key up-projection into latent space, scores
  // there against [latent, rotary key], and the weighted latent through its value
  // up-projection -> (n, heads * v_head_dim). Per step, heads x positions x (kv_rank +
  // rope) for the scores instead of expanding every cached position's keys and values.
  Tensor attend_latent(Device& dev, const Tensor& q_rows, const KvCache& cache, int64_t past);
  // The core: softmax(q k^T) v of the per-head operands into out_full, lse, attn_out.
  void core_forward(Device& dev);
  // The query projection's gradient dq (n, heads * qk) into the latent gradient buffer
  // (its first q_rank_ columns) or, without a query latent, into dx.
  void query_backward(Device& dev, const Tensor& dq, Tensor& latent_grad, Tensor& dx);
  // The latent gradients (n, q_rank + kv_rank + rope), summed over the group, through the
  // norms and down-projections into dx (written by the query latent's part, else added).
  void latent_backward(Device& dev, const Tensor& latent_grad, Tensor& dx);

  Communicator* tp_;  // null or of size 1
  int64_t heads_;     // of this rank
  int64_t nope_, rope_, v_dim_, qk_, width_;  // width_: D above
  int64_t q_rank_, kv_rank_;
  float eps_;
  float q_scale_;  // sqrt(D) x the softmax scale
  bool recompute_core_ = false;
  Param* wq_ = nullptr;  // without a query latent
  Param *wq_a_ = nullptr, *q_norm_ = nullptr, *wq_b_ = nullptr;
  Param *wkv_a_, *kv_norm_, *wkv_b_, *wo_;

  Saved saved_;
};

}  // namespace switchyard
