// CUDA causal attention with grouped KV heads (twin of kernels/cpu/attention.h). A
// straightforward kernel, one thread block per (query or key row, head, batch), that
// writes the same probs the CPU kernel saves for the backward; a fused (flash) kernel can
// replace it behind the same interface. q, k, v, out and the gradients are float or
// __nv_bfloat16 (loaded as float, every product, softmax and sum in float, each stored
// element rounded once); the saved probs are always float.
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

// q: (B, S, H, D), k, v: (B, S, KV, D) -> out: (B, S, H, D), probs: (B, H, S, S) with
// zeros above the diagonal.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, const AttentionShape& s, T* out,
                       float* probs, cudaStream_t stream);
// dq: (B, S, H, D), dk, dv: (B, S, KV, D), all written. A first pass writes dq and each
// query row's sum(p * dp); a second pass, one block per key row, adds the query heads of
// its group in head order, so dk and dv need no atomics and are deterministic.
template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const float* probs,
                        const AttentionShape& s, T* dq, T* dk, T* dv, cudaStream_t stream);

}  // namespace switchyard::cuda
