#include "kernels/gemm.h"

#include "kernels/cpu/gemm.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"
#endif

namespace switchyard {
namespace {

// A tensor read as a matrix: the last dimension is the columns, the rest the rows.
struct MatrixShape {
  int64_t rows;
  int64_t cols;
};

MatrixShape matrix_shape(const Tensor& t) {
  SY_CHECK_MSG(t.rank() >= 2, "gemm: operands need rank >= 2");
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.rank(); ++i) rows *= t.dim(i);
  return {rows, t.dim(-1)};
}

// Checks the grouped operands and returns the group count. The group sizes are host
// memory on every device: they decide the row blocks, i.e. the calls to make.
int64_t check_groups(const Tensor& group_sizes, int64_t rows) {
  SY_CHECK_MSG(group_sizes.dtype() == DType::kI32 && group_sizes.rank() == 1,
               "grouped matmul: group_sizes must be an i32 vector");
  SY_CHECK_MSG(!group_sizes.device().is_cuda(), "grouped matmul: group_sizes must be on the host");
  const int32_t* sizes = group_sizes.data<int32_t>();
  int64_t total = 0;
  for (int64_t g = 0; g < group_sizes.numel(); ++g) {
    SY_CHECK_MSG(sizes[g] >= 0, "grouped matmul: negative group size");
    total += sizes[g];
  }
  SY_CHECK_MSG(total == rows, "grouped matmul: group sizes do not add up to the row count");
  return group_sizes.numel();
}

}  // namespace

void matmul(Device& dev, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta) {
  SY_CHECK_MSG(a.dtype() == DType::kF32 && b.dtype() == DType::kF32 && c.dtype() == DType::kF32,
               "matmul: operands must be f32");
  const MatrixShape sa = matrix_shape(a), sb = matrix_shape(b), sc = matrix_shape(c);
  const int64_t m = trans_a ? sa.cols : sa.rows;
  const int64_t k = trans_a ? sa.rows : sa.cols;
  const int64_t n = trans_b ? sb.rows : sb.cols;
  SY_CHECK_MSG((trans_b ? sb.cols : sb.rows) == k, "matmul: inner dimensions differ");
  SY_CHECK_MSG(sc.rows == m && sc.cols == n, "matmul: output shape does not match");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::gemm<float>(op_cublas(dev, "matmul", {&a, &b, &c}), trans_a, trans_b, m, n, k, alpha,
                      a.data<float>(), sa.cols, b.data<float>(), sb.cols, beta, c.data<float>(),
                      sc.cols);
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "matmul: this build has no CUDA backend");
  cpu::gemm<float>(trans_a, trans_b, m, n, k, alpha, a.data<float>(), sa.cols, b.data<float>(),
                   sb.cols, beta, c.data<float>(), sc.cols);
}

void grouped_matmul_nt(Device& dev, const Tensor& a, const Tensor& w, const Tensor& group_sizes,
                       Tensor& out) {
  SY_CHECK_MSG(a.dtype() == DType::kF32 && w.dtype() == DType::kF32 && out.dtype() == DType::kF32,
               "grouped_matmul_nt: operands must be f32");
  SY_CHECK_MSG(w.rank() == 3, "grouped_matmul_nt: w must be (G, N, K)");
  const int64_t groups = w.dim(0), n = w.dim(1), k = w.dim(2);
  const MatrixShape sa = matrix_shape(a), so = matrix_shape(out);
  SY_CHECK_MSG(sa.cols == k && so.rows == sa.rows && so.cols == n,
               "grouped_matmul_nt: shapes do not match");
  SY_CHECK_MSG(check_groups(group_sizes, sa.rows) == groups,
               "grouped_matmul_nt: one group size per weight matrix");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::grouped_matmul_nt<float>(op_cublas(dev, "grouped_matmul_nt", {&a, &w, &out}),
                                   a.data<float>(), w.data<float>(), group_sizes.data<int32_t>(),
                                   groups, n, k, out.data<float>());
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "grouped_matmul_nt: this build has no CUDA backend");
  cpu::grouped_matmul_nt<float>(a.data<float>(), w.data<float>(), group_sizes.data<int32_t>(),
                                groups, n, k, out.data<float>());
}

void grouped_matmul_nn(Device& dev, const Tensor& a, const Tensor& w, const Tensor& group_sizes,
                       Tensor& out) {
  SY_CHECK_MSG(a.dtype() == DType::kF32 && w.dtype() == DType::kF32 && out.dtype() == DType::kF32,
               "grouped_matmul_nn: operands must be f32");
  SY_CHECK_MSG(w.rank() == 3, "grouped_matmul_nn: w must be (G, N, K)");
  const int64_t groups = w.dim(0), n = w.dim(1), k = w.dim(2);
  const MatrixShape sa = matrix_shape(a), so = matrix_shape(out);
  SY_CHECK_MSG(sa.cols == n && so.rows == sa.rows && so.cols == k,
               "grouped_matmul_nn: shapes do not match");
  SY_CHECK_MSG(check_groups(group_sizes, sa.rows) == groups,
               "grouped_matmul_nn: one group size per weight matrix");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::grouped_matmul_nn<float>(op_cublas(dev, "grouped_matmul_nn", {&a, &w, &out}),
                                   a.data<float>(), w.data<float>(), group_sizes.data<int32_t>(),
                                   groups, n, k, out.data<float>());
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "grouped_matmul_nn: this build has no CUDA backend");
  cpu::grouped_matmul_nn<float>(a.data<float>(), w.data<float>(), group_sizes.data<int32_t>(),
                                groups, n, k, out.data<float>());
}

void grouped_matmul_tn_accumulate(Device& dev, const Tensor& a, const Tensor& b,
                                  const Tensor& group_sizes, Tensor& dw) {
  SY_CHECK_MSG(a.dtype() == DType::kF32 && b.dtype() == DType::kF32 && dw.dtype() == DType::kF32,
               "grouped_matmul_tn_accumulate: operands must be f32");
  SY_CHECK_MSG(dw.rank() == 3, "grouped_matmul_tn_accumulate: dw must be (G, N, K)");
  const int64_t groups = dw.dim(0), n = dw.dim(1), k = dw.dim(2);
  const MatrixShape sa = matrix_shape(a), sb = matrix_shape(b);
  SY_CHECK_MSG(sa.cols == n && sb.cols == k && sb.rows == sa.rows,
               "grouped_matmul_tn_accumulate: shapes do not match");
  SY_CHECK_MSG(check_groups(group_sizes, sa.rows) == groups,
               "grouped_matmul_tn_accumulate: one group size per weight matrix");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::grouped_matmul_tn_accumulate<float>(
        op_cublas(dev, "grouped_matmul_tn_accumulate", {&a, &b, &dw}), a.data<float>(),
        b.data<float>(), group_sizes.data<int32_t>(), groups, n, k, dw.data<float>());
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "grouped_matmul_tn_accumulate: this build has no CUDA backend");
  cpu::grouped_matmul_tn_accumulate<float>(a.data<float>(), b.data<float>(),
                                           group_sizes.data<int32_t>(), groups, n, k,
                                           dw.data<float>());
}

}  // namespace switchyard
