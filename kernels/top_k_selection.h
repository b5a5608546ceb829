// The router's top-k selection, one definition for the CPU and CUDA kernels (host and
// device code): experts ranked by probability, ties to the lower id.
#pragma once

#include <cstdint>

#include "engine/runtime/host_device.h"

namespace switchyard {

// Whether expert a (prob pa) ranks before expert b (prob pb): higher probability
// first, lower id on ties. A NaN compares as a tie, so an all-NaN row (diverged
// logits) still yields k distinct, valid ids.
template <typename T>
SY_HOST_DEVICE bool ranks_before(T pa, int64_t a, T pb, int64_t b) {
  return pa > pb || (!(pa < pb) && a < b);
}

// The k best of one row's probabilities p (num_experts of them) into ids and w, in
// rank order; w divided by its sum when `renormalize`. k selection passes, each taking
// the best expert ranked after the previous pick: no scratch, cheap for the small k of
// MoE routers.
template <typename T>
SY_HOST_DEVICE void select_top_k(const T* p, int64_t num_experts, int k, bool renormalize,
                                 int32_t* ids, T* w) {
  int64_t prev = -1;
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (prev >= 0 && !ranks_before(p[prev], prev, p[e], e)) continue;
      if (best < 0 || ranks_before(p[e], e, p[best], best)) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    w[j] = p[best];
    prev = best;
  }
  if (renormalize) {
    T total = T(0);
    for (int j = 0; j < k; ++j) total += w[j];
    for (int j = 0; j < k; ++j) w[j] /= total;
  }
}

}  // namespace switchyard
