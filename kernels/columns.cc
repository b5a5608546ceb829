#include "kernels/columns.h"

#include "kernels/convert.h"
#include "kernels/cpu/columns.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/columns.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#endif

namespace switchyard {
namespace {

int64_t columns_of(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(t.rank() - 1); }
int64_t rows_of(const Tensor& t) {
  const int64_t cols = columns_of(t);
  return cols == 0 ? 0 : t.numel() / cols;
}

void check_blocks(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                  int64_t width) {
  SY_CHECK_MSG(src.dtype() == dst.dtype() && is_float(src),
               "copy_columns: src and dst must share one dtype, f32 or bf16");
  SY_CHECK_MSG(rows_of(src) == rows_of(dst), "copy_columns: src and dst differ in rows");
  SY_CHECK_MSG(width >= 0 && src_col >= 0 && dst_col >= 0 && src_col + width <= columns_of(src) &&
                   dst_col + width <= columns_of(dst),
               "copy_columns: a column block lies outside its matrix");
}

void run(Device& dev, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
         int64_t width, bool accumulate) {
  check_blocks(src, src_col, dst, dst_col, width);
  const int64_t rows = rows_of(src), ld_src = columns_of(src), ld_dst = columns_of(dst);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "copy_columns", {&src, &dst});
    with_cuda_type(src, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::copy_columns(cuda_data<T>(src) + src_col, ld_src, cuda_data<T>(dst) + dst_col, ld_dst,
                         rows, width, accumulate, stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "copy_columns: this build has no CUDA backend");
  if (src.dtype() == DType::kBF16 && accumulate) {
    Tensor values = widened(dst);
    run(dev, widened(src), src_col, values, dst_col, width, true);
    store(dev, values, dst);
    return;
  }
  if (src.dtype() == DType::kBF16) {
    cpu::copy_columns<bf16>(src.data<bf16>() + src_col, ld_src, dst.data<bf16>() + dst_col, ld_dst,
                            rows, width);
    return;
  }
  const float* from = src.data<float>() + src_col;
  float* to = dst.data<float>() + dst_col;
  if (accumulate)
    cpu::add_columns<float>(from, ld_src, to, ld_dst, rows, width);
  else
    cpu::copy_columns<float>(from, ld_src, to, ld_dst, rows, width);
}

}  // namespace

void copy_columns(Device& dev, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                  int64_t width) {
  run(dev, src, src_col, dst, dst_col, width, false);
}

void add_columns(Device& dev, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                 int64_t width) {
  run(dev, src, src_col, dst, dst_col, width, true);
}

}  // namespace switchyard
