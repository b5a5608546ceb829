// CPU rotary position embedding in the Hugging Face "rotate half" convention: channel j
// pairs with channel j + head_dim/2.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// table: (seq, head_dim/2, 2) of (cos, sin). The inverse frequencies and angles are
// float32 whatever T is, because that is what transformers does and checkpoints must
// give the same logits there; cos and sin are then taken in T.
template <typename T>
void rope_table(int64_t seq, int64_t head_dim, float theta, T* table) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float inv_freq =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    for (int64_t p = 0; p < seq; ++p) {
      const float angle = static_cast<float>(p) * inv_freq;
      table[(p * half + i) * 2] = std::cos(static_cast<T>(angle));
      table[(p * half + i) * 2 + 1] = std::sin(static_cast<T>(angle));
    }
  }
}

// x: (batch, seq, heads, head_dim) rotated in place by +angle (forward) or -angle
// (backward: the rotation is orthogonal, so its transpose is its inverse).
template <typename T>
void rope_rotate(const T* table, T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                 bool inverse) {
  const int64_t half = head_dim / 2;
  const T sign = inverse ? T(-1) : T(1);
#pragma omp parallel for schedule(static) if (batch * seq * heads * head_dim >= kParallelMinWork)
  for (int64_t bs = 0; bs < batch * seq; ++bs) {
    const T* cs = table + (bs % seq) * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      T* lo = x + (bs * heads + h) * head_dim;
      T* hi = lo + half;
      for (int64_t i = 0; i < half; ++i) {
        const T c = cs[2 * i];
        const T s = sign * cs[2 * i + 1];
        const T a = lo[i];
        const T b = hi[i];
        lo[i] = a * c - b * s;
        hi[i] = b * c + a * s;
      }
    }
  }
}

template <typename T>
void rope_forward(const T* table, T* x, int64_t batch, int64_t seq, int64_t heads,
                  int64_t head_dim) {
  rope_rotate(table, x, batch, seq, heads, head_dim, false);
}

template <typename T>
void rope_backward(const T* table, T* dx, int64_t batch, int64_t seq, int64_t heads,
                   int64_t head_dim) {
  rope_rotate(table, dx, batch, seq, heads, head_dim, true);
}

}  // namespace switchyard::cpu
