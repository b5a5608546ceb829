// CUDA causal attention with grouped KV heads (twin of kernels/cpu/attention.h), fused in
// the flash style: no score or probability matrix ever reaches global memory. The forward
// keeps a running max and sum per query row over key tiles and saves each row's
// log-sum-exp; the backward recomputes the probabilities per tile from q, k and it.
// q, k, v, out and the gradients are float or __nv_bfloat16. With bf16 the products run on
// tensor cores (bf16 operands, f32 accumulators), so the probabilities and their gradients
// are rounded to bf16 before they multiply v, dout, q or k; everything else (scores,
// softmax, sums, lse) is f32, and each stored element is rounded once. With float the same
// tiles run as plain f32 products. head_dim up to 128.
// doc_starts: null, or (B, S) int32 on the device for document-aware attention: where each
// query's document starts in its window (0 <= start_i <= i, non-decreasing along a
// window); query i then reads keys [start_i, i] only, and key tiles before a query tile's
// first start are skipped.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

struct AttentionShape {
  int64_t batch;
  int64_t seq;
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
};

// The largest head_dim the kernels take.
inline constexpr int64_t kAttentionMaxHeadDim = 128;

// q: (B, S, H, D), k, v: (B, S, KV, D) -> out: (B, S, H, D), lse: (B, H, S). One block per
// (query tile, head, batch).
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, const AttentionShape& s,
                       const int32_t* doc_starts, T* out, float* lse, cudaStream_t stream);
// dout, q, out: (B, S, H, D), k, v: (B, S, KV, D), lse: (B, H, S) -> dq: (B, S, H, D), dk, dv:
// (B, S, KV, D), all written. Three kernels: the row sums dout_i . out_i; one block per
// (key tile, KV head, batch) that adds dk and dv over the group's query heads and the query
// tiles in a fixed order; one block per (query tile, head, batch) for dq. No atomics, so
// the results are deterministic.
template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const AttentionShape& s, const int32_t* doc_starts,
                        T* dq, T* dk, T* dv, cudaStream_t stream);

}  // namespace switchyard::cuda
