// CPU rotary position embedding in the Hugging Face "rotate half" convention: channel j
// pairs with channel j + head_dim/2.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// theta^(2i/head_dim), the inverse of channel pair i's frequency, in float32 as
// transformers computes it.
inline float rope_wavelength_scale(int64_t i, int64_t head_dim, float theta) {
  return std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
}

// The inverse frequencies theta^(-2i/head_dim), i < head_dim/2.
inline std::vector<float> rope_inv_freq(int64_t head_dim, float theta) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = 1.0f / rope_wavelength_scale(static_cast<int64_t>(i), head_dim, theta);
  return inv_freq;
}

// table: (seq, inv_freq.size(), 2) of (cos, sin) x attention_factor. The angles are
// float32 whatever T is, because that is what transformers does and checkpoints must
// give the same logits there; cos and sin are then taken in T.
template <typename T>
void rope_table(int64_t seq, const std::vector<float>& inv_freq, float attention_factor,
                T* table) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  const T factor = static_cast<T>(attention_factor);
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t p = 0; p < seq; ++p) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      table[(p * half + i) * 2] = std::cos(static_cast<T>(angle)) * factor;
      table[(p * half + i) * 2 + 1] = std::sin(static_cast<T>(angle)) * factor;
    }
  }
}

// The plain rotary table of head_dim channels.
template <typename T>
void rope_table(int64_t seq, int64_t head_dim, float theta, T* table) {
  rope_table(seq, rope_inv_freq(head_dim, theta), 1.0f, table);
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
