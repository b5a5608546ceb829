// Dense-to-MoE upcycling: a dense model read by read_hf_dense_model made a mixture of
// experts whose first forward equals the dense model's (docs/convert.md#upcycling).
//
// With granularity G, the dense FFN's intermediate dimension F is cut into G slices of
// I = F / G rows; SwiGLU acts row by row, so FFN(x) = sum_g FFN_g(x), FFN_g the FFN of
// slice g. Expert e = c * G + g is copy c of slice g with its down projection scaled by
// G. The router's row for expert c * G + g is row c of a random matrix (normal, std the
// model's init_std): every slice of a copy gets the same logit. Gating is softmax top-k
// with the top-k weights renormalised. With K a multiple of G, the K largest logits are
// the G equal logits of each of K / G copies (S), whatever the tie order; each of their
// experts gets the gate p_c, and sum_{c in S} G p_c = 1. The output is
// sum_{c in S} p_c sum_g G FFN_g(x) = FFN(x): the dense model's, up to rounding, for
// every token. With G = 1 every expert is the dense FFN and any router gives it.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "checkpoint/hf_import.h"

namespace switchyard {

struct UpcycleOptions {
  int64_t experts = 0;      // E, a multiple of granularity
  int64_t top_k = 0;        // K, a multiple of granularity, at most E
  int64_t granularity = 1;  // G, dividing the dense FFN's width
  uint64_t seed = 0;        // the router's random rows
};

// The MoE model of `dense` (every layer a dense FFN): options that do not fit the model
// are refused naming the option, before anything is allocated.
absl::StatusOr<HfModel> upcycle(const HfModel& dense, const UpcycleOptions& options);

}  // namespace switchyard
