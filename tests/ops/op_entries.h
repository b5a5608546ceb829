// What the files of op table entries (tests/ops/op_table.cc, tests/ops/*_entries.cc)
// share: the dtype lists, the inputs, and the entries each file contributes to
// op_table().
#pragma once

#include <cstdint>
#include <vector>

#include "tests/ops/op_table.h"

namespace switchyard::testing {

inline constexpr DType kF32 = DType::kF32;
inline constexpr DType kBF16 = DType::kBF16;

// Both operand dtypes of an op with two, in every combination; one operand dtype.
extern const std::vector<std::vector<DType>> kTwoDtypes;
extern const std::vector<std::vector<DType>> kOneDtype;

// A host input of `shape` in `dtype`: uniform fractions in [lo, hi), or integers in
// [lo, hi] for a case with integer inputs.
Tensor input(const Shape& shape, DType dtype, uint64_t seed, const OpCase& c, double lo = -1.0,
             double hi = 1.0);

// The inputs of products and long sums: integers in [-4, 4], or fractions in [-1, 1),
// whose f32 sums stay within the relative tolerance where they cancel.
double value_range(const OpCase& c);

// Writable copies of reference inputs, for templates that work in place.
std::vector<double> copy(const std::vector<double>& v);

// Ids held as doubles, back to i32.
std::vector<int32_t> as_ids(const std::vector<double>& v);

// Expert ids (n, k) uniform in [-1, experts): -1 marks an unsent assignment, which counts
// for no expert.
Tensor expert_ids(int64_t n, int64_t k, int64_t experts, uint64_t seed);

// The router's entries (tests/ops/routing_entries.cc): gatings, router statistics and
// losses, cross-entropy.
std::vector<OpEntry> routing_entries();

}  // namespace switchyard::testing
