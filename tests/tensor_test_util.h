// Helpers for the tests that run ops on tensors, on any device: host tensors of seeded
// inputs, outputs poisoned before an op runs (NaN, or an integer no op writes, so an
// element the op fails to write fails the comparison; NaN never compares equal or
// close), and comparisons of results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "core/runtime/tensor.h"
#include "tests/test_util.h"

namespace switchyard::testing {

// A host tensor of `shape` holding `values`.
template <typename T>
Tensor host_tensor(const Shape& shape, const std::vector<T>& values) {
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  SY_CHECK(static_cast<int64_t>(values.size()) == t.numel());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

// A 1-D host tensor holding `values`.
template <typename T>
Tensor host_tensor(const std::vector<T>& values) {
  return host_tensor({static_cast<int64_t>(values.size())}, values);
}

// Host f32 tensors of uniform values in [lo, hi), or of integers in [lo, hi] (for the
// tests that demand exact results).
inline Tensor random_tensor(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return host_tensor(shape, random_vector<float>(shape_numel(shape), seed, lo, hi));
}
inline Tensor integer_tensor(const Shape& shape, uint64_t seed, int lo, int hi) {
  return host_tensor(shape, random_integers<float>(shape_numel(shape), seed, lo, hi));
}

// A copy of host tensor `host` on `dev`, and back.
inline Tensor to_device(Device& dev, const Tensor& host) { return host.to(dev); }
inline Tensor to_host(const Tensor& device_tensor) { return device_tensor.on_host(); }

// The elements of a host or device tensor.
template <typename T>
std::vector<T> values_of(const Tensor& t) {
  const Tensor host = t.device().is_cuda() ? to_host(t) : t;
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

// A tensor on `dev` holding no value an op writes: NaN for f32 and bf16, 0x7F7F7F7F for i32.
inline Tensor poisoned(Device& dev, const Shape& shape, DType dtype = DType::kF32) {
  const int64_t n = shape_numel(shape);
  if (dtype == DType::kI32)
    return to_device(dev, host_tensor(shape, std::vector<int32_t>(n, 0x7F7F7F7F)));
  if (dtype == DType::kBF16)
    return to_device(dev, host_tensor(shape, std::vector<bf16>(n, bf16{0x7FC0})));
  SY_CHECK(dtype == DType::kF32);
  return to_device(
      dev, host_tensor(shape, std::vector<float>(n, std::numeric_limits<float>::quiet_NaN())));
}

inline std::vector<double> as_doubles(const Tensor& t) {
  if (t.dtype() == DType::kI32) {
    const std::vector<int32_t> v = values_of<int32_t>(t);
    return std::vector<double>(v.begin(), v.end());
  }
  if (t.dtype() == DType::kBF16) {
    std::vector<double> d;
    for (bf16 v : values_of<bf16>(t)) d.push_back(to_float(v));
    return d;
  }
  const std::vector<float> v = values_of<float>(t);
  return std::vector<double>(v.begin(), v.end());
}

// Every element of `actual` within tol * max(1, scale[i]) of `expected` (tol = 0: equal);
// a NaN on either side fails.
inline ::testing::AssertionResult all_within(const std::vector<double>& a,
                                             const std::vector<double>& e,
                                             const std::vector<double>& scale, double tol) {
  if (a.size() != e.size() || scale.size() != e.size()) {
    return ::testing::AssertionFailure() << a.size() << " elements, expected " << e.size();
  }
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = !std::isnan(a[i]) && !std::isnan(e[i]) &&
                    std::abs(a[i] - e[i]) <= tol * std::max(1.0, scale[i]);
    if (ok) continue;
    if (bad < 5) first << "\n  [" << i << "] got " << a[i] << " expected " << e[i];
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " elements differ (tol " << tol << "):" << first.str();
}

// The same for tensors, whose shapes and dtypes must match.
inline ::testing::AssertionResult all_within(const Tensor& actual, const Tensor& expected,
                                             const std::vector<double>& scale, double tol) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure()
           << "shape or dtype differs: " << shape_string(actual.shape()) << " vs "
           << shape_string(expected.shape());
  }
  return all_within(as_doubles(actual), as_doubles(expected), scale, tol);
}

// Relative closeness: the bound scales with |expected|.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                            double tol) {
  std::vector<double> scale = as_doubles(expected);
  for (double& v : scale) v = std::abs(v);
  return all_within(actual, expected, scale, tol);
}

inline ::testing::AssertionResult all_equal(const Tensor& actual, const Tensor& expected) {
  return all_close(actual, expected, 0.0);
}

inline bool any_nonzero(const Tensor& t) { return any_nonzero(as_doubles(t)); }

}  // namespace switchyard::testing
