// CPU causal attention with grouped KV heads, built on GEMMs per (batch, head) that read
// the (batch, seq, heads, head_dim) layouts in place through leading-dimension strides.
// Queries are processed in row blocks so that the products skip the blocks above the
// causal diagonal. Heads run one after another and only OpenBLAS threads (each GEMM):
// OpenMP loops between the GEMMs were slower on 2 cores, because the idle OpenMP and
// OpenBLAS workers spin against each other.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vector_math.h"

namespace switchyard::cpu {

// Rows per causal block: large enough for efficient GEMMs, small enough that little
// work above the diagonal is wasted.
inline constexpr int64_t kAttentionBlock = 64;

struct AttentionShape {
  int64_t batch;
  int64_t seq;
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
};

namespace attention_internal {

// p: one row of scores in place over [0, len) -> softmax; [len, width) set to zero.
template <typename T>
void causal_softmax_row(T* p, int64_t len, int64_t width) {
  T max = p[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 1; j < len; ++j) max = p[j] > max ? p[j] : max;
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; ++j) {
    p[j] = exp_nonpositive(p[j] - max);
    sum += p[j];
  }
  const T inv = T(1) / sum;
  for (int64_t j = 0; j < len; ++j) p[j] *= inv;
  std::fill(p + len, p + width, T(0));
}

// ds row over [0, len): p * (dp - sum(dp * p)); [len, width) set to zero. ds holds dp.
template <typename T>
void softmax_backward_row(const T* p, T* ds, int64_t len, int64_t width) {
  T dot = T(0);
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < len; ++j) dot += ds[j] * p[j];
  for (int64_t j = 0; j < len; ++j) ds[j] = p[j] * (ds[j] - dot);
  std::fill(ds + len, ds + width, T(0));
}

}  // namespace attention_internal

// q: (B, S, H, D), k, v: (B, S, KV, D) -> out: (B, S, H, D), probs: (B, H, S, S).
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, const AttentionShape& s, T* out,
                       T* probs) {
  const int64_t S = s.seq, D = s.head_dim;
  const int64_t ld_q = s.heads * D, ld_kv = s.kv_heads * D;
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      const T* qh = q + b * S * ld_q + h * D;
      const T* kg = k + b * S * ld_kv + g * D;
      const T* vg = v + b * S * ld_kv + g * D;
      T* oh = out + b * S * ld_q + h * D;
      T* p = probs + (b * s.heads + h) * S * S;
      for (int64_t r0 = 0; r0 < S; r0 += kAttentionBlock) {
        const int64_t r1 = std::min(S, r0 + kAttentionBlock);
        gemm<T>(false, true, r1 - r0, r1, D, scale, qh + r0 * ld_q, ld_q, kg, ld_kv, T(0),
                p + r0 * S, S);
        for (int64_t i = r0; i < r1; ++i)
          attention_internal::causal_softmax_row(p + i * S, i + 1, S);
        gemm<T>(false, false, r1 - r0, D, r1, T(1), p + r0 * S, S, vg, ld_kv, T(0), oh + r0 * ld_q,
                ld_q);
      }
    }
  }
}

// dout, q: (B, S, H, D), k, v: (B, S, KV, D), probs: (B, H, S, S) -> dq: (B, S, H, D),
// dk, dv: (B, S, KV, D), all written. The query heads sharing a KV head add into its
// dk, dv one after another in head order, so the sums do not depend on threading.
template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* probs,
                        const AttentionShape& s, T* dq, T* dk, T* dv) {
  const int64_t S = s.seq, D = s.head_dim;
  const int64_t ld_q = s.heads * D, ld_kv = s.kv_heads * D;
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  std::vector<T> ds_buffer(static_cast<size_t>(S * S));
  T* ds = ds_buffer.data();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      const T* kg = k + b * S * ld_kv + g * D;
      const T* vg = v + b * S * ld_kv + g * D;
      T* dkg = dk + b * S * ld_kv + g * D;
      T* dvg = dv + b * S * ld_kv + g * D;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* qh = q + b * S * ld_q + h * D;
        const T* doh = dout + b * S * ld_q + h * D;
        const T* p = probs + (b * s.heads + h) * S * S;
        T* dqh = dq + b * S * ld_q + h * D;
        for (int64_t r0 = 0; r0 < S; r0 += kAttentionBlock) {
          const int64_t r1 = std::min(S, r0 + kAttentionBlock);
          gemm<T>(false, true, r1 - r0, r1, D, T(1), doh + r0 * ld_q, ld_q, vg, ld_kv, T(0),
                  ds + r0 * S, S);
          for (int64_t i = r0; i < r1; ++i) {
            attention_internal::softmax_backward_row(p + i * S, ds + i * S, i + 1, r1);
          }
          gemm<T>(false, false, r1 - r0, D, r1, scale, ds + r0 * S, S, kg, ld_kv, T(0),
                  dqh + r0 * ld_q, ld_q);
        }
        // dk, dv rows [c0, c1) only see query rows i >= c0 (causality); the first head of
        // the group writes them, the others add.
        const T beta = h == g * group ? T(0) : T(1);
        for (int64_t c0 = 0; c0 < S; c0 += kAttentionBlock) {
          const int64_t c1 = std::min(S, c0 + kAttentionBlock);
          gemm<T>(true, false, c1 - c0, D, S - c0, scale, ds + c0 * S + c0, S, qh + c0 * ld_q, ld_q,
                  beta, dkg + c0 * ld_kv, ld_kv);
          gemm<T>(true, false, c1 - c0, D, S - c0, T(1), p + c0 * S + c0, S, doh + c0 * ld_q, ld_q,
                  beta, dvg + c0 * ld_kv, ld_kv);
        }
      }
    }
  }
}

}  // namespace switchyard::cpu
