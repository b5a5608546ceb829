// Helpers for the tests of ops on bf16 operands (CPU and GPU).
#pragma once

#include <cstring>

#include "core/runtime/tensor.h"
#include "kernels/convert.h"

namespace switchyard::testing {

// A host copy of host tensor `t` in `dtype`: exact for f32, rounded once for bf16.
inline Tensor to_dtype(const Tensor& t, DType dtype) {
  Tensor c = Tensor::empty(t.shape(), dtype);
  convert(cpu_device(), t, c);
  return c;
}

inline Tensor as_bf16(const Tensor& t) { return to_dtype(t, DType::kBF16); }

// Host tensor `actual` holds the f32 `expected` in its own dtype (rounded once for
// bf16), bit for bit.
inline bool stores(const Tensor& actual, const Tensor& expected) {
  const Tensor stored = to_dtype(expected, actual.dtype());
  return actual.shape() == stored.shape() &&
         std::memcmp(actual.raw_data(), stored.raw_data(), actual.nbytes()) == 0;
}

}  // namespace switchyard::testing
