// CPU kernels of Muon's elementwise steps (kernels/muon.h), templates on the element type
// so tests can run them in double.
#pragma once

#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// momentum = mu * momentum + grad_scale * grad; input = grad_scale * grad + mu * momentum
// (Nesterov) or momentum.
template <typename T>
void muon_momentum(const T* grad, T* momentum, T* input, int64_t n, T mu, bool nesterov,
                   T grad_scale) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * grad_scale;
    const T m = mu * momentum[i] + g;
    momentum[i] = m;
    input[i] = nesterov ? g + mu * m : m;
  }
}

// param = param * decay - step * update.
template <typename T>
void muon_apply(T* param, const T* update, int64_t n, T decay, T step) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) param[i] = param[i] * decay - step * update[i];
}

}  // namespace switchyard::cpu
