// The cuBLAS implementations of the grouped products (kernels/cuda/gemm.h): one
// cublasGemmGroupedBatchedEx call (cuda::grouped_batched_matmul_*) and the per-group
// cuBLASLt loop (cuda::grouped_matmul_*), with f32 operands, and with bf16 operands and a
// bf16 result or an f32 one (which the grouped batched call hands to the loop), against the CPU
// grouped ops on the same operands (bf16 widened to f32). Integer-valued inputs make every
// product and every f32 sum exact on both, so those cases demand equality, the bf16
// results after the same final rounding. The shapes are awkward on purpose: empty groups
// first, inside and last, one-row groups, equal sizes (one cuBLAS group) at different
// pointer alignments, N and K that are no multiple of 8 (bf16 rows start 2-byte aligned),
// groups whose bf16 pointers miss the alignment a grouped batched call asks for (they run
// alone), and no rows at all.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kernels/cuda/gemm.h"
#include "kernels/gemm.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::any_nonzero;
using testing::host_tensor;
using testing::integer_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;
using testing::to_dtype;
using testing::values_of;

struct Implementation {
  const char* name;
  decltype(&cuda::grouped_matmul_nt) nt;
  decltype(&cuda::grouped_matmul_nn) nn;
  decltype(&cuda::grouped_matmul_tn_accumulate) tn_accumulate;
};

const Implementation kImplementations[] = {
    {"per-group loop", cuda::grouped_matmul_nt, cuda::grouped_matmul_nn,
     cuda::grouped_matmul_tn_accumulate},
    {"grouped batched", cuda::grouped_batched_matmul_nt, cuda::grouped_batched_matmul_nn,
     cuda::grouped_batched_matmul_tn_accumulate},
};

struct Types {
  DType operands, result;
};

const Types kTypes[] = {
    {DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}};

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

// Integer values in [-4, 4], or uniform floats, in `dtype`.
Tensor operand(const Shape& shape, uint64_t seed, bool integers, DType dtype) {
  return to_dtype(integers ? integer_tensor(shape, seed, -4, 4) : random_tensor(shape, seed),
                  dtype);
}

// Random inputs: bf16 results within one rounding (1/128 relative); f32 results within
// what a different order of the f32 sums gives (wider for bf16 operands, which run on
// tensor cores).
::testing::AssertionResult matches(const Tensor& gpu, const Tensor& cpu, bool integers,
                                   Types types) {
  if (integers) return all_equal(gpu, cpu);
  if (types.result == DType::kBF16) return all_close(gpu, cpu, 1.0 / 128);
  return all_close(gpu, cpu, types.operands == DType::kBF16 ? 2e-4 : 1e-5);
}

struct Case {
  std::vector<int32_t> sizes;
  int64_t n, k;
};

std::vector<Case> cases() {
  return {
      {{0, 5, 0, 37, 1, 33, 0}, 65, 129},  // empty groups first, inside and last; one row
      {{3, 3, 3, 3}, 65, 129},             // equal sizes, pointers at 2, 4 and 8+ bytes
      {{64, 64, 64, 64}, 128, 256},        // equal sizes, everything 16-byte aligned
      {{16, 0, 48, 16, 7}, 48, 136},       // multiples of 8, and one group that is not
      {{4, 8, 8, 3}, 33, 40},              // tn: bf16 groups of 8 rows start 8-byte aligned
      {{0, 0, 0}, 65, 129},                // no rows at all
  };
}

TEST(GroupedBatchedGemmGpu, ProductsMatchCpu) {
  CudaDevice gpu(0);
  for (const Case& c : cases()) {
    const int64_t groups = static_cast<int64_t>(c.sizes.size());
    const int64_t rows = std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0});
    const int64_t n = c.n, k = c.k;
    const Tensor host_sizes = host_tensor({groups}, c.sizes);
    for (const Types types : kTypes) {
      const cuda::GemmTypes gemm_types{cuda_type(types.operands), cuda_type(types.result)};
      for (bool integers : {true, false}) {
        const Tensor a_k = operand({rows, k}, 1, integers, types.operands);
        const Tensor a_n = operand({rows, n}, 2, integers, types.operands);
        const Tensor b_k = operand({rows, k}, 3, integers, types.operands);
        const Tensor w = operand({groups, n, k}, 4, integers, types.operands);
        const Tensor ga_k = to_device(gpu, a_k), ga_n = to_device(gpu, a_n);
        const Tensor gb_k = to_device(gpu, b_k), gw = to_device(gpu, w);
        // The CPU results, and dw's starting values (accumulated into).
        Tensor out_n = Tensor::empty({rows, n}, types.result);
        grouped_matmul_nt(cpu_device(), a_k, w, host_sizes, out_n);
        Tensor out_k = Tensor::empty({rows, k}, types.result);
        grouped_matmul_nn(cpu_device(), a_n, w, host_sizes, out_k);
        const Tensor dw0 = to_dtype(integer_tensor({groups, n, k}, 5, -4, 4), types.result);
        Tensor dw = to_dtype(dw0, types.result);
        grouped_matmul_tn_accumulate(cpu_device(), a_n, b_k, host_sizes, dw);
        if (rows > 0) {
          EXPECT_TRUE(any_nonzero(out_n));
          EXPECT_TRUE(any_nonzero(out_k));
        }
        for (const Implementation& impl : kImplementations) {
          SCOPED_TRACE(::testing::Message()
                       << impl.name << ", " << groups << " groups, " << rows << " rows, n " << n
                       << ", k " << k << ", " << dtype_name(types.operands) << " operands, "
                       << dtype_name(types.result) << " result"
                       << (integers ? ", integers" : ", random"));
          const int32_t* sizes = host_sizes.data<int32_t>();
          Tensor gout_n = poisoned(gpu, {rows, n}, types.result);
          impl.nt(gpu.blas(), ga_k.raw_data(), gw.raw_data(), sizes, groups, n, k,
                  gout_n.raw_data(), gemm_types);
          EXPECT_TRUE(matches(gout_n, out_n, integers, types));
          Tensor gout_k = poisoned(gpu, {rows, k}, types.result);
          impl.nn(gpu.blas(), ga_n.raw_data(), gw.raw_data(), sizes, groups, n, k,
                  gout_k.raw_data(), gemm_types);
          EXPECT_TRUE(matches(gout_k, out_k, integers, types));
          Tensor gdw = to_device(gpu, dw0);
          impl.tn_accumulate(gpu.blas(), ga_n.raw_data(), gb_k.raw_data(), sizes, groups, n, k,
                             gdw.raw_data(), gemm_types);
          EXPECT_TRUE(matches(gdw, dw, integers, types));
        }
      }
    }
  }
}

// A group without rows adds nothing to its dw[g], not even 0: NaN there stays NaN.
TEST(GroupedBatchedGemmGpu, EmptyGroupsLeaveWeightGradientsUntouched) {
  CudaDevice gpu(0);
  const int64_t n = 24, k = 40;
  const std::vector<int32_t> sizes = {0, 7, 0};
  const Tensor host_sizes = host_tensor({3}, sizes);
  for (const Types types : kTypes) {
    SCOPED_TRACE(::testing::Message() << dtype_name(types.operands) << " operands, "
                                      << dtype_name(types.result) << " result");
    const Tensor a = operand({7, n}, 6, true, types.operands);
    const Tensor b = operand({7, k}, 7, true, types.operands);
    const Tensor ga = to_device(gpu, a), gb = to_device(gpu, b);
    std::vector<float> start = values_of<float>(integer_tensor({3, n, k}, 8, -4, 4));
    std::fill(start.begin(), start.begin() + n * k, NAN);
    std::fill(start.begin() + 2 * n * k, start.end(), NAN);
    Tensor dw = to_dtype(host_tensor({3, n, k}, start), types.result);
    Tensor gdw = to_device(gpu, dw);
    cuda::grouped_batched_matmul_tn_accumulate(
        gpu.blas(), ga.raw_data(), gb.raw_data(), host_sizes.data<int32_t>(), 3, n, k,
        gdw.raw_data(), {cuda_type(types.operands), cuda_type(types.result)});
    grouped_matmul_tn_accumulate(cpu_device(), a, b, host_sizes, dw);
    const Tensor got_f32 = to_dtype(testing::to_host(gdw), DType::kF32);
    const Tensor want_f32 = to_dtype(dw, DType::kF32);
    const std::vector<float> got = values_of<float>(got_f32), want = values_of<float>(want_f32);
    for (int64_t i = 0; i < 3 * n * k; ++i) {
      if (i / (n * k) == 1)
        ASSERT_EQ(got[i], want[i]) << "element " << i;
      else
        ASSERT_TRUE(std::isnan(got[i])) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
