// The engine's tensor-core grouped products (bf16 operands, kernels/cuda/grouped_gemm.h),
// through the public ops, against the CPU on the same bf16 operands (widened to f32).
// Integer-valued inputs make every product and every f32 sum exact on both, so those
// cases demand equality, the bf16 results after the same final rounding. The shapes are
// awkward on purpose: empty and one-row groups, rows on both sides of the 128-row tile,
// N and K that are no multiple of 16 (element-wise reads) or multiples of 8 only (16-byte
// reads with tails), 64 skewed groups, 1000 groups; with the sizes on the host and on the
// device.
#include "kernels/cuda/grouped_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kernels/gemm.h"
#include "tests/bf16_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::any_nonzero;
using testing::as_bf16;
using testing::host_tensor;
using testing::integer_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::to_device;
using testing::to_dtype;
using testing::values_of;

// Integer values in [-4, 4], or uniform floats, as bf16.
Tensor operand(const Shape& shape, uint64_t seed, bool integers) {
  return as_bf16(integers ? integer_tensor(shape, seed, -4, 4) : random_tensor(shape, seed));
}

// Random inputs: bf16 results within one rounding (1/128 relative); f32 results within
// what the different order of the f32 sums gives (the tensor cores' f32 additions do not
// round as the CPU's do either).
::testing::AssertionResult matches(const Tensor& gpu, const Tensor& cpu, bool integers) {
  if (integers) return all_equal(gpu, cpu);
  return all_close(gpu, cpu, gpu.dtype() == DType::kBF16 ? 1.0 / 128 : 2e-4);
}

// 64 groups: every fifth empty, the others 1 to 28 rows, and one of 700.
std::vector<int32_t> skewed_sizes() {
  std::vector<int32_t> sizes(64);
  for (int g = 0; g < 64; ++g) sizes[g] = g % 5 == 0 ? 0 : 1 + g * 37 % 28;
  sizes[3] = 700;
  return sizes;
}

// More groups than one launch passes host sizes in (kernels/cuda/grouped_gemm.cu).
std::vector<int32_t> many_sizes() {
  std::vector<int32_t> sizes(1000);
  for (int g = 0; g < 1000; ++g) sizes[g] = g % 3;
  return sizes;
}

struct Case {
  std::vector<int32_t> sizes;
  int64_t n, k;
};

std::vector<Case> cases() {
  return {
      {{0, 5, 0, 37, 1, 33, 0}, 65, 129},  // empty groups first, inside and last; one row
      {{300}, 33, 65},                     // one group, rows no multiple of the tile
      {{129, 128, 127, 1, 256}, 129, 33},  // row tiles just past, at and short of 128
      {skewed_sizes(), 48, 136},           // 16-byte reads, partial column tiles
      {{200, 0, 57}, 256, 128},            // whole column tiles, several reduction slices
      {many_sizes(), 16, 24},              // 1000 groups of 0 to 2 rows
      {{0, 0, 0}, 65, 129},                // no rows at all
  };
}

TEST(GroupedGemmGpu, LayoutScansDeviceSizes) {
  CudaDevice gpu(0);
  for (const std::vector<int32_t>& sizes : {std::vector<int32_t>{0, 5, 0, 37, 1, 33, 0},
                                            skewed_sizes(), std::vector<int32_t>(600, 3)}) {
    const int64_t groups = static_cast<int64_t>(sizes.size());
    const int64_t rows = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    SCOPED_TRACE(::testing::Message() << groups << " groups");
    std::vector<int32_t> offsets = {0}, tile_starts = {0};
    for (int32_t s : sizes) {
      offsets.push_back(offsets.back() + s);
      tile_starts.push_back(tile_starts.back() + (s + 3) / 4);
    }
    const Tensor device_sizes = to_device(gpu, host_tensor({groups}, sizes));
    Tensor goffsets = poisoned(gpu, {groups + 1}, DType::kI32);
    Tensor gtile_starts = poisoned(gpu, {groups + 1}, DType::kI32);
    cuda::group_layout(device_sizes.data<int32_t>(), groups, rows, 4, goffsets.data<int32_t>(),
                       gtile_starts.data<int32_t>(), gpu.stream());
    EXPECT_EQ(values_of<int32_t>(goffsets), offsets);
    EXPECT_EQ(values_of<int32_t>(gtile_starts), tile_starts);
  }
}

TEST(GroupedGemmGpu, ProductsMatchCpu) {
  CudaDevice gpu(0);
  for (const Case& c : cases()) {
    const int64_t groups = static_cast<int64_t>(c.sizes.size());
    const int64_t rows = std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0});
    const int64_t n = c.n, k = c.k;
    const Tensor host_sizes = host_tensor({groups}, c.sizes);
    for (bool integers : {true, false}) {
      const Tensor a_k = operand({rows, k}, 1, integers);
      const Tensor a_n = operand({rows, n}, 2, integers);
      const Tensor b_k = operand({rows, k}, 3, integers);
      const Tensor w = operand({groups, n, k}, 4, integers);
      const Tensor ga_k = to_device(gpu, a_k), ga_n = to_device(gpu, a_n);
      const Tensor gb_k = to_device(gpu, b_k), gw = to_device(gpu, w);
      for (DType result : {DType::kF32, DType::kBF16}) {
        // The CPU results, and dw's starting values (accumulated into).
        Tensor out_n = Tensor::empty({rows, n}, result);
        grouped_matmul_nt(cpu_device(), a_k, w, host_sizes, out_n);
        Tensor out_k = Tensor::empty({rows, k}, result);
        grouped_matmul_nn(cpu_device(), a_n, w, host_sizes, out_k);
        const Tensor dw0 = to_dtype(integer_tensor({groups, n, k}, 5, -4, 4), result);
        Tensor dw = to_dtype(dw0, result);
        grouped_matmul_tn_accumulate(cpu_device(), a_n, b_k, host_sizes, dw);
        if (rows > 0) {
          EXPECT_TRUE(any_nonzero(out_n));
          EXPECT_TRUE(any_nonzero(out_k));
        }
        for (bool sizes_on_device : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << groups << " groups, " << rows << " rows, n " << n << ", k " << k
                       << (integers ? ", integers" : ", random") << ", result "
                       << dtype_name(result) << ", sizes on the "
                       << (sizes_on_device ? "device" : "host"));
          const Tensor sizes = sizes_on_device ? to_device(gpu, host_sizes) : host_sizes;
          Tensor gout_n = poisoned(gpu, {rows, n}, result);
          grouped_matmul_nt(gpu, ga_k, gw, sizes, gout_n);
          EXPECT_TRUE(matches(gout_n, out_n, integers));
          Tensor gout_k = poisoned(gpu, {rows, k}, result);
          grouped_matmul_nn(gpu, ga_n, gw, sizes, gout_k);
          EXPECT_TRUE(matches(gout_k, out_k, integers));
          Tensor gdw = to_device(gpu, dw0);
          grouped_matmul_tn_accumulate(gpu, ga_n, gb_k, sizes, gdw);
          EXPECT_TRUE(matches(gdw, dw, integers));
        }
      }
    }
  }
}

// A group without rows adds nothing to its dw[g], not even 0: NaN there stays NaN.
TEST(GroupedGemmGpu, EmptyGroupsLeaveWeightGradientsUntouched) {
  CudaDevice gpu(0);
  const int64_t n = 24, k = 40;
  const std::vector<int32_t> sizes = {0, 7, 0};
  const Tensor host_sizes = host_tensor({3}, sizes);
  const Tensor a = operand({7, n}, 6, true), b = operand({7, k}, 7, true);
  std::vector<float> start = values_of<float>(integer_tensor({3, n, k}, 8, -4, 4));
  std::fill(start.begin(), start.begin() + n * k, NAN);
  std::fill(start.begin() + 2 * n * k, start.end(), NAN);
  Tensor dw = host_tensor({3, n, k}, start);
  Tensor gdw = to_device(gpu, dw);
  grouped_matmul_tn_accumulate(gpu, to_device(gpu, a), to_device(gpu, b),
                               to_device(gpu, host_sizes), gdw);
  grouped_matmul_tn_accumulate(cpu_device(), a, b, host_sizes, dw);
  const std::vector<float> got = values_of<float>(gdw), want = values_of<float>(dw);
  for (int64_t i = 0; i < 3 * n * k; ++i) {
    if (i / (n * k) == 1)
      ASSERT_EQ(got[i], want[i]) << "element " << i;
    else
      ASSERT_TRUE(std::isnan(got[i])) << "element " << i;
  }
}

// Sizes adding up to fewer than the rows (the MoE layer's buffers sized for every
// assignment while a capacity drops some): the group rows match the exact buffers', the
// poisoned rows past them stay poisoned, and NaNs there do not reach dw. bf16 operands
// (the tensor-core kernel) and f32 (the cuBLAS loop), sizes on the device.
TEST(GroupedGemmGpu, RowsPastTheGroupsAreNeitherReadNorWritten) {
  CudaDevice gpu(0);
  const int64_t n = 48, k = 136, spare = 150;  // more than a row tile past the groups
  const std::vector<int32_t> sizes = {0, 70, 3, 129};
  const int64_t used = 202, rows = used + spare;
  const Tensor device_sizes = to_device(gpu, host_tensor({4}, sizes));
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto operand_with_nan_tail = [&](int64_t cols, uint64_t seed) {
      std::vector<float> v = values_of<float>(integer_tensor({used, cols}, seed, -4, 4));
      v.resize(rows * cols, NAN);
      return to_device(gpu, to_dtype(host_tensor({rows, cols}, v), dtype));
    };
    const Tensor a_k = operand_with_nan_tail(k, 11), a_n = operand_with_nan_tail(n, 12);
    const Tensor w = to_device(gpu, to_dtype(integer_tensor({4, n, k}, 13, -4, 4), dtype));
    Tensor out_n = poisoned(gpu, {rows, n}, dtype), out_k = poisoned(gpu, {rows, k}, dtype);
    grouped_matmul_nt(gpu, a_k, w, device_sizes, out_n);
    grouped_matmul_nn(gpu, a_n, w, device_sizes, out_k);
    const Tensor dw0 = to_dtype(integer_tensor({4, n, k}, 14, -4, 4), dtype);
    Tensor dw = to_device(gpu, dw0);
    grouped_matmul_tn_accumulate(gpu, a_n, a_k, device_sizes, dw);

    const Tensor exact_sizes = host_tensor({4}, sizes);
    Tensor want_n = Tensor::empty({used, n}, dtype), want_k = Tensor::empty({used, k}, dtype);
    const Tensor host_a_k = a_k.on_host().slice_rows(0, used);
    const Tensor host_a_n = a_n.on_host().slice_rows(0, used);
    grouped_matmul_nt(cpu_device(), host_a_k, w.on_host(), exact_sizes, want_n);
    grouped_matmul_nn(cpu_device(), host_a_n, w.on_host(), exact_sizes, want_k);
    Tensor want_dw = to_dtype(dw0, dtype);
    grouped_matmul_tn_accumulate(cpu_device(), host_a_n, host_a_k, exact_sizes, want_dw);
    EXPECT_TRUE(all_equal(out_n.slice_rows(0, used), want_n));
    EXPECT_TRUE(all_equal(out_k.slice_rows(0, used), want_k));
    EXPECT_TRUE(all_equal(dw, want_dw));
    for (const Tensor* out : {&out_n, &out_k})
      for (double v : testing::as_doubles(out->slice_rows(used, rows))) ASSERT_TRUE(std::isnan(v));
  }
}

// f32 operands keep the cuBLAS loop, which copies device sizes to the host: the same
// calls, so the same bits as with host sizes.
TEST(GroupedGemmGpu, F32OperandsTakeDeviceSizes) {
  CudaDevice gpu(0);
  const int64_t n = 65, k = 33;
  const std::vector<int32_t> sizes = {3, 0, 40, 1};
  const Tensor host_sizes = host_tensor({4}, sizes);
  const Tensor device_sizes = to_device(gpu, host_sizes);
  const Tensor a = to_device(gpu, random_tensor({44, k}, 9));
  const Tensor w = to_device(gpu, random_tensor({4, n, k}, 10));
  Tensor from_host = poisoned(gpu, {44, n}), from_device = poisoned(gpu, {44, n});
  grouped_matmul_nt(gpu, a, w, host_sizes, from_host);
  grouped_matmul_nt(gpu, a, w, device_sizes, from_device);
  EXPECT_TRUE(all_equal(from_device, from_host));
  EXPECT_TRUE(any_nonzero(from_host));
  // A run of products takes the sizes where they need them: f32 on the host, bf16 where
  // they are.
  EXPECT_EQ(values_of<int32_t>(group_sizes_for(gpu, DType::kF32, device_sizes)), sizes);
  EXPECT_FALSE(group_sizes_for(gpu, DType::kF32, device_sizes).device().is_cuda());
  EXPECT_EQ(group_sizes_for(gpu, DType::kBF16, device_sizes).raw_data(), device_sizes.raw_data());
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
