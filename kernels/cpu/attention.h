// CPU causal attention with grouped KV heads, built on GEMMs per (batch, head) that read
// the (batch, seq, heads, head_dim) layouts in place through leading-dimension strides.
// Queries are processed in row blocks so that the products skip the blocks above the
// causal diagonal, and only one block of scores or probabilities exists at a time: the
// forward saves each row's log-sum-exp, and the backward recomputes the probabilities
// from it (the exact math the CUDA flash kernels follow tile by tile). Heads run one after
// another and only OpenBLAS threads (each GEMM): OpenMP loops between the GEMMs were
// slower on 2 cores, because the idle OpenMP and OpenBLAS workers spin against each other.
// Document-aware attention (packed windows of several documents) passes each position's
// document start: query i then reads keys [start_i, i] only, and each block's products
// begin at its first row's start.
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
// Returns the row's log-sum-exp, max + log(sum(exp(score - max))).
template <typename T>
T causal_softmax_row(T* p, int64_t len, int64_t width) {
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
  return max + std::log(sum);
}

// p: one row of scores in place over [0, len) -> exp(score - lse), the softmax again;
// [len, width) set to zero. The scores are the forward's bits and lse >= their max, so
// the arguments are not positive.
template <typename T>
void probs_from_lse_row(T* p, T lse, int64_t len, int64_t width) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) p[j] = exp_nonpositive(p[j] - lse);
  std::fill(p + len, p + width, T(0));
}

// ds row over [0, len): p * (dp - row_dot); [len, width) set to zero. ds holds dp.
template <typename T>
void softmax_backward_row(const T* p, T* ds, T row_dot, int64_t len, int64_t width) {
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) ds[j] = p[j] * (ds[j] - row_dot);
  std::fill(ds + len, ds + width, T(0));
}

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

// The first key row query i of window b reads: its document's start, or 0 without
// documents (doc_starts null).
inline int64_t key_start(const int32_t* doc_starts, int64_t b, int64_t seq, int64_t i) {
  return doc_starts ? doc_starts[b * seq + i] : 0;
}

}  // namespace attention_internal

// doc_starts: null (plain causal attention) or (B, S) int32, the position in its window
// where each query's document starts: 0 <= start_i <= i, non-decreasing along a window
// (a document's positions are contiguous). Query i then reads keys [start_i, i].

// q: (B, S, H, D), k, v: (B, S, KV, D) -> out: (B, S, H, D) and lse: (B, H, S), each
// query row's log-sum-exp of its scaled scores, all the backward needs of the softmax.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, const AttentionShape& s, T* out,
                       T* lse, const int32_t* doc_starts = nullptr) {
  const int64_t S = s.seq, D = s.head_dim;
  const int64_t ld_q = s.heads * D, ld_kv = s.kv_heads * D;
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  // One block of probability rows, row stride S.
  std::vector<T> p_buffer(static_cast<size_t>(std::min(S, kAttentionBlock) * S));
  T* p = p_buffer.data();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / group;
      const T* qh = q + b * S * ld_q + h * D;
      const T* kg = k + b * S * ld_kv + g * D;
      const T* vg = v + b * S * ld_kv + g * D;
      T* oh = out + b * S * ld_q + h * D;
      T* lse_h = lse + (b * s.heads + h) * S;
      for (int64_t r0 = 0; r0 < S; r0 += kAttentionBlock) {
        const int64_t r1 = std::min(S, r0 + kAttentionBlock);
        // Key rows [lo, r1) are the ones this block's queries see; p's columns start at lo.
        const int64_t lo = attention_internal::key_start(doc_starts, b, S, r0), width = r1 - lo;
        gemm<T>(false, true, r1 - r0, width, D, scale, qh + r0 * ld_q, ld_q, kg + lo * ld_kv,
                ld_kv, T(0), p, S);
        for (int64_t i = r0; i < r1; ++i) {
          T* row = p + (i - r0) * S;
          const int64_t begin = attention_internal::key_start(doc_starts, b, S, i) - lo;
          std::fill(row, row + begin, T(0));
          lse_h[i] =
              attention_internal::causal_softmax_row(row + begin, i + 1 - lo - begin, width - begin);
        }
        gemm<T>(false, false, r1 - r0, D, width, T(1), p, S, vg + lo * ld_kv, ld_kv, T(0),
                oh + r0 * ld_q, ld_q);
      }
    }
  }
}

// dout, q, out: (B, S, H, D), k, v: (B, S, KV, D), lse: (B, H, S) from the forward ->
// dq: (B, S, H, D), dk, dv: (B, S, KV, D), all written. Each block of probabilities is
// recomputed from q, k and lse; the softmax backward's row sums sum_j p_ij dp_ij are
// dout_i . out_i, as the flash kernels take them. The query heads sharing a KV head add
// into its dk, dv one after another in head and block order, so the sums do not depend
// on threading.
template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, const AttentionShape& s, T* dq, T* dk, T* dv,
                        const int32_t* doc_starts = nullptr) {
  const int64_t S = s.seq, D = s.head_dim;
  const int64_t ld_q = s.heads * D, ld_kv = s.kv_heads * D;
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  // One block of probability rows and one of their gradients, row stride S.
  const size_t block_size = static_cast<size_t>(std::min(S, kAttentionBlock) * S);
  std::vector<T> p_buffer(block_size), ds_buffer(block_size);
  T* p = p_buffer.data();
  T* ds = ds_buffer.data();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      const T* kg = k + b * S * ld_kv + g * D;
      const T* vg = v + b * S * ld_kv + g * D;
      T* dkg = dk + b * S * ld_kv + g * D;
      T* dvg = dv + b * S * ld_kv + g * D;
      for (int64_t j = 0; j < S; ++j) {
        std::fill(dkg + j * ld_kv, dkg + j * ld_kv + D, T(0));
        std::fill(dvg + j * ld_kv, dvg + j * ld_kv + D, T(0));
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const T* qh = q + b * S * ld_q + h * D;
        const T* doh = dout + b * S * ld_q + h * D;
        const T* oh = out + b * S * ld_q + h * D;
        const T* lse_h = lse + (b * s.heads + h) * S;
        T* dqh = dq + b * S * ld_q + h * D;
        for (int64_t r0 = 0; r0 < S; r0 += kAttentionBlock) {
          const int64_t r1 = std::min(S, r0 + kAttentionBlock), rows = r1 - r0;
          // Key rows [lo, r1) are the ones this block's queries see; p's columns start at lo.
          const int64_t lo = attention_internal::key_start(doc_starts, b, S, r0), width = r1 - lo;
          const T* k_lo = kg + lo * ld_kv;
          const T* v_lo = vg + lo * ld_kv;
          gemm<T>(false, true, rows, width, D, scale, qh + r0 * ld_q, ld_q, k_lo, ld_kv, T(0), p, S);
          gemm<T>(false, true, rows, width, D, T(1), doh + r0 * ld_q, ld_q, v_lo, ld_kv, T(0), ds,
                  S);
          for (int64_t i = r0; i < r1; ++i) {
            T* p_row = p + (i - r0) * S;
            T* ds_row = ds + (i - r0) * S;
            const int64_t begin = attention_internal::key_start(doc_starts, b, S, i) - lo;
            const int64_t len = i + 1 - lo - begin;
            std::fill(p_row, p_row + begin, T(0));
            std::fill(ds_row, ds_row + begin, T(0));
            attention_internal::probs_from_lse_row(p_row + begin, lse_h[i], len, width - begin);
            const T row_dot = attention_internal::dot(doh + i * ld_q, oh + i * ld_q, D);
            attention_internal::softmax_backward_row(p_row + begin, ds_row + begin, row_dot, len,
                                                     width - begin);
          }
          gemm<T>(false, false, rows, D, width, scale, ds, S, k_lo, ld_kv, T(0), dqh + r0 * ld_q,
                  ld_q);
          gemm<T>(true, false, width, D, rows, scale, ds, S, qh + r0 * ld_q, ld_q, T(1),
                  dkg + lo * ld_kv, ld_kv);
          gemm<T>(true, false, width, D, rows, T(1), p, S, doh + r0 * ld_q, ld_q, T(1),
                  dvg + lo * ld_kv, ld_kv);
        }
      }
    }
  }
}

}  // namespace switchyard::cpu
