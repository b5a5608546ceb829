// The cross-backend op table. Every op the engine runs on both backends is one entry:
// its shapes (awkward ones included: empty, odd, past one grid of GPU blocks), operand
// dtypes, integer or random inputs, what it runs (forward and backward) and its double
// template (kernels/cpu/*.h in double). tests/ops/op_table_test.cc checks every entry
// the same way: the f32/bf16 op against the double template, the template's backward
// against finite differences of its forward, and, where a GPU is present, the CUDA op
// against the CPU op with the GPU's outputs poisoned first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/runtime/tensor.h"

namespace switchyard::testing {

// One configuration of an entry: its dims (the entry says what they mean), the dtypes of
// its operands (likewise), and whether its inputs hold small integers or random
// fractions. Sums and products of small integers are exact in any order, so with
// integer inputs every result must be exact, against the template and across backends
// (as i32 results, bookkeeping, always must).
struct OpCase {
  Shape dims;
  std::vector<DType> dtypes;
  bool integers = false;
};

// How a result is compared, against the double template and across backends.
enum class Match {
  kClose,     // within tol * max(1, |expected|)
  kSum,       // a long sum: within tol * max(1, the sum over the terms' magnitudes)
  kExact,     // the backends agree exactly even on fractions (the same additions in the
              // same order); the template as kClose
  kExactSum,  // exactly across backends, the template as kSum
};

// One result of an op, read back to the host.
struct OpResult {
  std::string name;
  Match match = Match::kClose;
  DType dtype = DType::kF32;
  bool f64 = false;  // host sums in double (sum_squares), not a tensor
  std::vector<double> values;
  double tol = -1;  // this result's own tolerance; negative: the entry's for its dtype
};

// A result tensor (read back to the host now) and host sums in double.
OpResult result(const std::string& name, const Tensor& t, Match match = Match::kClose);
OpResult result(const std::string& name, const std::vector<double>& sums);

// What an entry's run sees: the device, the case's inputs on it, and where its outputs
// go. Written outputs start poisoned on every device (an element the op skips fails),
// updated ones as a copy of an input.
class OpRun {
 public:
  OpRun(Device& device, std::vector<Tensor> inputs) : device_(device), inputs_(std::move(inputs)) {}
  Device& device() const { return device_; }
  const Tensor& in(size_t i) const { return inputs_.at(i); }
  Tensor written(const Shape& shape, DType dtype = DType::kF32) const;
  // A copy of input i where the inputs are, for an op that updates it in place or
  // accumulates into it.
  Tensor updated(size_t i) const;

 private:
  Device& device_;
  std::vector<Tensor> inputs_;
};

// Values in double, one vector per input or result.
using Values = std::vector<std::vector<double>>;

// The loss whose gradient a backward computes is dot(in[upstream], result[output]);
// the result `gradient` holds d loss / d in[input], plus in[base] when it accumulates
// onto that input (base < 0: written).
struct Gradient {
  size_t input;
  size_t gradient;
  int base = -1;
};

// Tolerances per result dtype: f32 results of ops with only f32 operands, f32 results
// when some operand is bf16 (the op then sums or divides in f32 what the template takes
// from exact bf16 values), bf16 results (one rounding: 1/256 relative, and the
// arithmetic before it), sums in double.
struct Tolerance {
  double f32 = 1e-5;
  double f32_from_bf16 = 1e-4;
  double bf16 = 1.0 / 128;
  double f64 = 1e-12;
};

struct OpEntry {
  std::string name;
  std::vector<Shape> dims;
  std::vector<std::vector<DType>> dtypes;
  std::vector<bool> integers = {false};
  // The case's inputs as host tensors in its dtypes.
  std::function<std::vector<Tensor>(const OpCase&)> inputs;
  // Runs the op on run.device(); every result in a fixed order.
  std::function<std::vector<OpResult>(const OpRun&, const OpCase&)> run;
  // The double template on the inputs' values: the results' values in run's order.
  // Empty for an op that has none (a conversion is its own definition).
  std::function<Values(const Values&, const OpCase&)> reference;
  // The backward's check by finite differences of the reference, on each of these small
  // dims (with the first dtypes); no gradients: the op has no backward.
  std::vector<Shape> gradient_dims;
  size_t loss_result = 0;
  size_t upstream = 0;
  std::vector<Gradient> gradients;
  // Inputs that steer a discrete choice (the priorities that decide which assignments a
  // capacity keeps): the magnitudes of kSum results take them as they are, not their
  // absolute values, so that they follow the same choices as the results.
  std::vector<size_t> choice_inputs;
  Tolerance tol;
  // Properties of one backend's results, checked on each (results agreeing with each
  // other bit for bit, say).
  std::function<void(const std::vector<OpResult>&)> invariant;
};

// `x` rounded to bf16; and `x` stored in `dtype` (rounded for f32 and bf16), as an op
// stores its exact result.
double bf16_rounded(double x);
double stored(double x, DType dtype);

// 64 group sizes: every fifth empty, the others 1 to 28 rows, and one of 700 (for the
// grouped products, and the GPU's layout of their groups).
inline std::vector<int32_t> skewed_group_sizes() {
  std::vector<int32_t> sizes(64);
  for (int g = 0; g < 64; ++g) sizes[g] = g % 5 == 0 ? 0 : 1 + g * 37 % 28;
  sizes[3] = 700;
  return sizes;
}

// Every entry, in the order the tests run them.
const std::vector<OpEntry>& op_table();

}  // namespace switchyard::testing
