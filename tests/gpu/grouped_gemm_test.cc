// What the grouped products do on the GPU besides their results (those are the op
// table's grouped_matmul entry, tests/ops/op_table.h): the layout kernel's scan of group
// sizes held on the device, and the f32 operands' cuBLAS loop taking such sizes, through
// the host, for the same bits as host sizes.
#include "kernels/cuda/grouped_gemm.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kernels/gemm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/ops/op_table.h"

namespace switchyard {
namespace {

using testing::all_equal;
using testing::any_nonzero;
using testing::host_tensor;
using testing::poisoned;
using testing::random_tensor;
using testing::skewed_group_sizes;
using testing::to_device;
using testing::values_of;

TEST(GroupedGemmGpu, LayoutScansDeviceSizes) {
  CudaDevice gpu(0);
  for (const std::vector<int32_t>& sizes : {std::vector<int32_t>{0, 5, 0, 37, 1, 33, 0},
                                            skewed_group_sizes(), std::vector<int32_t>(600, 3)}) {
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
