// Runs every entry of the op table (tests/ops/op_table.h) through the same checks:
// - MatchesTheDoubleTemplate: the op on the CPU, in each case's dtypes, against the
//   double template on the same input values;
// - BackwardMatchesFiniteDifferences: the template's backward against central
//   differences of its forward, in double;
// - CudaMatchesCpu (skipped without a GPU): the CUDA op against the CPU op from the same
//   inputs, its outputs poisoned first;
// - CudaRefusesTensorsOffItsDevice (skipped without a GPU): the CUDA op given host
//   inputs ends the process with a message naming the device.
// OpTableRunner runs the same checks on entries broken on purpose, so each check is seen
// to fail where it should, the cross-backend one included (the CPU against itself).
// Built twice from these sources: ops.op_table_test, whose GPU checks skip wherever the
// CPU tests run, and, with the CUDA backend, gpu_op_table_test (label gpu), which runs
// all four where the GPU is.
#include "tests/ops/op_table.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/devices.h"
#include "kernels/elementwise.h"
#include "tests/finite_differences.h"
#include "tests/tensor_test_util.h"

namespace switchyard::testing {
namespace {

// The double template runs on cases with at most this many input elements; the larger
// ones (past a GPU grid) are for the GPU check alone.
constexpr int64_t kTemplateElements = int64_t{1} << 24;
// Central differences in double: step and relative tolerance.
constexpr double kStep = 1e-6, kGradientTol = 1e-6;

std::vector<OpCase> cases_of(const OpEntry& e) {
  std::vector<OpCase> cases;
  for (const Shape& dims : e.dims)
    for (const std::vector<DType>& dtypes : e.dtypes)
      for (bool integers : e.integers) cases.push_back(OpCase{dims, dtypes, integers});
  return cases;
}

std::string describe(const OpCase& c) {
  std::ostringstream s;
  s << "dims " << shape_string(c.dims) << ", dtypes";
  for (DType d : c.dtypes) s << " " << dtype_name(d);
  s << (c.integers ? ", integers" : ", fractions");
  return s.str();
}

Values values_of(const std::vector<Tensor>& tensors) {
  Values v;
  for (const Tensor& t : tensors) v.push_back(as_doubles(t));
  return v;
}

int64_t elements(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

// The inputs' absolute values (ids and counts as they are): the template on them gives
// each long sum's bound, the same sum over its terms' magnitudes.
Values magnitudes_of(const OpEntry& e, const std::vector<Tensor>& inputs, const OpCase& c) {
  Values in = values_of(inputs);
  for (size_t i = 0; i < in.size(); ++i) {
    const bool choice =
        std::find(e.choice_inputs.begin(), e.choice_inputs.end(), i) != e.choice_inputs.end();
    if (inputs[i].dtype() == DType::kI32 || choice) continue;
    for (double& x : in[i]) x = std::abs(x);
  }
  Values out = e.reference(in, c);
  for (std::vector<double>& v : out)
    for (double& x : v) x = std::abs(x);
  return out;
}

bool has_sums(const std::vector<OpResult>& results) {
  for (const OpResult& r : results)
    if (r.match == Match::kSum || r.match == Match::kExactSum) return true;
  return false;
}

double tolerance(const Tolerance& tol, const OpResult& r, const OpCase& c) {
  if (r.tol >= 0) return r.tol;
  if (r.f64) return tol.f64;
  if (r.dtype == DType::kBF16) return tol.bf16;
  for (DType d : c.dtypes)
    if (d == DType::kBF16) return tol.f32_from_bf16;
  return tol.f32;
}

// The same values (a zero of either sign matching the other), NaN matching NaN.
::testing::AssertionResult same_values(const std::vector<double>& a, const std::vector<double>& e) {
  if (a.size() != e.size())
    return ::testing::AssertionFailure() << a.size() << " elements, expected " << e.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == e[i] || (std::isnan(a[i]) && std::isnan(e[i]))) continue;
    return ::testing::AssertionFailure() << "[" << i << "] got " << a[i] << " expected " << e[i];
  }
  return ::testing::AssertionSuccess();
}

// The template's values as the result stores them (rounded once to its dtype), for an
// exact comparison.
std::vector<double> as_stored(const std::vector<double>& values, const OpResult& r) {
  if (r.f64) return values;
  std::vector<double> out;
  for (double x : values) out.push_back(stored(x, r.dtype));
  return out;
}

// The elements of `values` where `actual` and `expected` are not both NaN (an element
// the op leaves unwritten, as the template says it must).
std::vector<double> where_not_both_nan(const std::vector<double>& values,
                                       const std::vector<double>& actual,
                                       const std::vector<double>& expected) {
  if (actual.size() != expected.size()) return values;
  std::vector<double> kept;
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isnan(actual[i]) || !std::isnan(expected[i])) kept.push_back(values[i]);
  return kept;
}

// `actual` against `expected` as its Match says: exact (when `exact`), within tol of the
// sum bound `magnitudes`, or within tol relative to |expected|; NaN matches NaN.
::testing::AssertionResult matches(const OpResult& actual, const std::vector<double>& expected,
                                   const std::vector<double>* magnitudes, double tol, bool exact) {
  ::testing::AssertionResult outcome = ::testing::AssertionSuccess();
  const std::vector<double>& a = actual.values;
  if (exact) {
    outcome = same_values(a, expected);
  } else if (actual.match == Match::kSum || actual.match == Match::kExactSum) {
    // A bound below the value it bounds would make the check exact where it is not.
    for (size_t j = 0; j < expected.size(); ++j)
      if (std::isfinite(expected[j]) && (*magnitudes)[j] < std::abs(expected[j]) * (1 - 1e-9))
        return ::testing::AssertionFailure()
               << "the magnitude " << (*magnitudes)[j] << " of [" << j << "] is below its value "
               << expected[j] << " (" << actual.name << ")";
    outcome =
        all_within(where_not_both_nan(a, a, expected), where_not_both_nan(expected, a, expected),
                   where_not_both_nan(*magnitudes, a, expected), tol);
  } else {
    std::vector<double> scale = where_not_both_nan(expected, a, expected);
    for (double& x : scale) x = std::abs(x);
    outcome = all_within(where_not_both_nan(a, a, expected),
                         where_not_both_nan(expected, a, expected), scale, tol);
  }
  if (!outcome) outcome << " (" << actual.name << ")";
  return outcome;
}

// The GPU, or null where there is none (or no CUDA backend).
Device* gpu() {
  if (visible_gpus() == 0) return nullptr;
  std::string error;
  return select_device("cuda", 0, &error);
}

// The op on the CPU against the double template, for every case small enough.
void check_template(const OpEntry& e) {
  for (const OpCase& c : cases_of(e)) {
    const std::vector<Tensor> inputs = e.inputs(c);
    if (elements(inputs) > kTemplateElements) continue;
    SCOPED_TRACE(describe(c));
    const std::vector<OpResult> results = e.run(OpRun(cpu_device(), inputs), c);
    if (e.invariant) e.invariant(results);
    const Values expected = e.reference(values_of(inputs), c);
    const Values magnitudes = has_sums(results) ? magnitudes_of(e, inputs, c) : Values{};
    ASSERT_EQ(results.size(), expected.size());
    for (size_t i = 0; i < results.size(); ++i) {
      const OpResult& r = results[i];
      const double tol = tolerance(e.tol, r, c);
      const bool exact = tol == 0 || c.integers || r.dtype == DType::kI32;
      EXPECT_TRUE(matches(r, exact ? as_stored(expected[i], r) : expected[i],
                          magnitudes.empty() ? nullptr : &magnitudes[i], tol, exact));
    }
  }
}

// The template's backward against central differences of its forward, on case `c`.
void check_gradient_case(const OpEntry& e, const OpCase& c) {
  SCOPED_TRACE(describe(c));
  Values in = values_of(e.inputs(c));
  const Values analytic = e.reference(in, c);
  auto loss = [&] {
    const std::vector<double> out = e.reference(in, c)[e.loss_result];
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += in[e.upstream][i] * out[i];
    return sum;
  };
  for (const Gradient& g : e.gradients) {
    SCOPED_TRACE(::testing::Message() << "d loss / d input " << g.input);
    std::vector<double> numeric = testing::central_differences(in[g.input], kStep, loss);
    if (g.base >= 0) {
      for (size_t i = 0; i < numeric.size(); ++i) numeric[i] += in[g.base][i];
    }
    EXPECT_LT(max_relative_error(analytic[g.gradient], numeric), kGradientTol);
    EXPECT_TRUE(any_nonzero(analytic[g.gradient]));
  }
}

// check_gradient_case on each of the entry's gradient_dims.
void check_gradients(const OpEntry& e) {
  for (const Shape& dims : e.gradient_dims)
    check_gradient_case(e, OpCase{dims, e.dtypes[0], false});
}

// The op on `device` against the op on the CPU, from the same inputs, every case.
void check_backends(const OpEntry& e, Device& device) {
  for (const OpCase& c : cases_of(e)) {
    SCOPED_TRACE(describe(c));
    const std::vector<Tensor> inputs = e.inputs(c);
    std::vector<Tensor> copies;
    for (const Tensor& t : inputs) copies.push_back(t.to(device));
    const std::vector<OpResult> expected = e.run(OpRun(cpu_device(), inputs), c);
    const std::vector<OpResult> results = e.run(OpRun(device, copies), c);
    if (e.invariant) e.invariant(results);
    const Values magnitudes = has_sums(results) ? magnitudes_of(e, inputs, c) : Values{};
    ASSERT_EQ(results.size(), expected.size());
    for (size_t i = 0; i < results.size(); ++i) {
      const OpResult& r = results[i];
      const bool exact = r.match == Match::kExact || r.match == Match::kExactSum || c.integers;
      EXPECT_TRUE(matches(r, expected[i].values, magnitudes.empty() ? nullptr : &magnitudes[i],
                          tolerance(e.tol, r, c), exact));
    }
  }
}

class OpTable : public ::testing::TestWithParam<size_t> {
 protected:
  const OpEntry& entry() const { return op_table()[GetParam()]; }
};

TEST_P(OpTable, MatchesTheDoubleTemplate) { check_template(entry()); }

TEST_P(OpTable, BackwardMatchesFiniteDifferences) {
  if (entry().gradients.empty()) GTEST_SKIP() << entry().name << " has no backward";
  check_gradients(entry());
}

TEST_P(OpTable, CudaMatchesCpu) {
  Device* device = gpu();
  if (device == nullptr) GTEST_SKIP() << "no GPU";
  check_backends(entry(), *device);
}

class OpTableDeathTest : public OpTable {};

TEST_P(OpTableDeathTest, CudaRefusesTensorsOffItsDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the parent holds a CUDA context
  Device* device = gpu();
  if (device == nullptr) GTEST_SKIP() << "no GPU";
  const OpEntry& e = entry();
  for (const OpCase& c : cases_of(e)) {
    // A zero in dims may be a count or an offset; an input without elements is what
    // lets a kernel run without touching memory.
    const std::vector<Tensor> inputs = e.inputs(c);
    bool empty = false;
    for (const Tensor& t : inputs) empty = empty || t.numel() == 0;
    if (empty) continue;
    // Outputs on the GPU, inputs (and the copies updated in place) left on the host.
    const OpRun run(*device, inputs);
    EXPECT_DEATH(e.run(run, c), "not on the op's device");
    return;
  }
  FAIL() << e.name << " has no case whose inputs all have elements";
}

std::string entry_name(const ::testing::TestParamInfo<size_t>& info) {
  return op_table()[info.param].name;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::Range(size_t{0}, op_table().size()), entry_name);
INSTANTIATE_TEST_SUITE_P(Ops, OpTableDeathTest, ::testing::Range(size_t{0}, op_table().size()),
                         entry_name);

// Entries that break a promise on purpose, so the runner is seen to catch each: an op
// that leaves an element of its output unwritten (still poisoned), a backward that is not
// its forward's gradient, and backends that disagree (a second run that differs).
// Two inputs x and y of 5 elements, returned as they are; each entry below breaks this.
OpEntry identity_entry(const std::string& name) {
  OpEntry e;
  e.name = name;
  e.dims = {{5}};
  e.dtypes = {{DType::kF32}};
  e.inputs = [](const OpCase& c) {
    return std::vector<Tensor>{random_tensor(c.dims, 1), random_tensor(c.dims, 2)};
  };
  e.reference = [](const Values& in, const OpCase&) { return Values{in[0], in[1]}; };
  return e;
}

OpEntry skips_an_element() {
  OpEntry e = identity_entry("skips_an_element");
  e.run = [](const OpRun& r, const OpCase&) {
    Tensor out = r.written({5});
    Tensor head = out.slice_rows(0, 4);
    head.copy_from(r.in(0).slice_rows(0, 4));
    return std::vector<OpResult>{result("x", out), result("y", r.in(1))};
  };
  return e;
}

// y = 2 x with dx = 3 dy claimed as its backward.
OpEntry wrong_backward() {
  OpEntry e = identity_entry("wrong_backward");
  e.reference = [](const Values& in, const OpCase&) {
    std::vector<double> y = in[0], dx = in[1];
    for (double& v : y) v *= 2;
    for (double& v : dx) v *= 3;
    return Values{y, dx};
  };
  e.gradient_dims = {{5}};
  e.loss_result = 0;
  e.upstream = 1;
  e.gradients = {{0, 1}};
  return e;
}

OpEntry differs_on_a_second_run() {
  OpEntry e = identity_entry("differs_on_a_second_run");
  auto runs = std::make_shared<int>(0);
  e.run = [runs](const OpRun& r, const OpCase&) {
    Tensor x = r.updated(0);
    if (++*runs % 2 == 0) scale_(r.device(), x, 1.0f + 1.0f / 1024);
    return std::vector<OpResult>{result("x", x, Match::kExact), result("y", r.in(1))};
  };
  return e;
}

TEST(OpTableRunner, CatchesAnUnwrittenElement) {
  EXPECT_NONFATAL_FAILURE(check_template(skips_an_element()), "1 of 5 elements differ");
}

TEST(OpTableRunner, CatchesABackwardThatIsNotTheGradient) {
  EXPECT_NONFATAL_FAILURE(check_gradients(wrong_backward()), "max_relative_error");
}

TEST(OpTableRunner, CatchesBackendsThatDisagree) {
  EXPECT_NONFATAL_FAILURE(check_backends(differs_on_a_second_run(), cpu_device()), "(x)");
}

}  // namespace
}  // namespace switchyard::testing
