// CPU SwiGLU kernels on a fused gate/up row: gate in [0, I), up in [I, 2I).
#pragma once

#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// gate_up: (rows, 2I) -> out: (rows, I) = silu(gate) * up.
template <typename T> void swiglu_forward(const T* gate_up, T* out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * inter;
    const T* up = gate + inter;
    T* o = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) o[i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

// dgate_up: (rows, 2I) written. silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a).
template <typename T>
void swiglu_backward(const T* dout, const T* gate_up, T* dgate_up, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * inter;
    const T* up = gate + inter;
    const T* d = dout + r * inter;
    T* dgate = dgate_up + r * 2 * inter;
    T* dup = dgate + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const T a = gate[i];
      const T s = sigmoid(a);
      dgate[i] = d[i] * up[i] * s * (T(1) + a * (T(1) - s));
      dup[i] = d[i] * a * s;
    }
  }
}

}  // namespace switchyard::cpu
