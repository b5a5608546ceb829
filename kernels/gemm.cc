#include "kernels/gemm.h"

#include <initializer_list>
#include <string>

#include "kernels/convert.h"
#include "kernels/cpu/gemm.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"
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

// Host group sizes: none negative, and they add up to at most the row count.
void check_host_sizes(const Tensor& group_sizes, int64_t rows) {
  const int32_t* sizes = group_sizes.data<int32_t>();
  int64_t total = 0;
  for (int64_t g = 0; g < group_sizes.numel(); ++g) {
    SY_CHECK_MSG(sizes[g] >= 0, "grouped matmul: negative group size");
    total += sizes[g];
  }
  SY_CHECK_MSG(total <= rows, "grouped matmul: group sizes add up to more than the rows");
}

// Checks the group sizes and returns the group count. Host sizes are checked here; sizes
// on a CUDA device where they are read (on the device by the tensor-core kernels, or here
// once copied to the host for the cuBLASLt loop).
int64_t check_groups(const Device& dev, const Tensor& group_sizes, int64_t rows) {
  SY_CHECK_MSG(group_sizes.dtype() == DType::kI32 && group_sizes.rank() == 1,
               "grouped matmul: group_sizes must be an i32 vector");
  if (group_sizes.device().is_cuda())
    SY_CHECK_MSG(dev.is_cuda(), "grouped matmul: on the CPU, group_sizes must be on the host");
  else
    check_host_sizes(group_sizes, rows);
  return group_sizes.numel();
}

// The operands share one element type, f32 or bf16; the result is f32, or bf16 for bf16
// operands (cuBLASLt has no f32-operand product with a bf16 result, and the CPU follows).
void check_types(const char* op, const Tensor& a, const Tensor& b, const Tensor& c) {
  const bool result_ok = c.dtype() == DType::kF32 || c.dtype() == a.dtype();
  if (is_float(a) && a.dtype() == b.dtype() && is_float(c) && result_ok) return;
  const std::string message = std::string(op) +
                              ": operands must be both f32 or both bf16, the result f32 or (for "
                              "bf16 operands) bf16";
  internal::check_failed(__FILE__, __LINE__, "operand types", message.c_str());
}

#ifdef SWITCHYARD_WITH_CUDA
cuda::GemmTypes gemm_types(const Tensor& operand, const Tensor& result) {
  auto type = [](const Tensor& t) { return t.dtype() == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; };
  return {type(operand), type(result)};
}

const __nv_bfloat16* bf16_data(const Tensor& t) { return cuda_data<const __nv_bfloat16>(t); }

// Runs grouped product `op` on a CUDA device. bf16 operands go to the tensor-core kernel:
// `kernel(sizes, stream, result_type)` with the sizes where they are and the result's
// CUDA type (std::type_identity). f32 operands go to the cuBLASLt loop: `loop(blas,
// host_sizes)`, whose calls are sized on the host, so sizes on the device are copied
// there (which waits for the stream) and checked.
template <typename Kernel, typename Loop>
void grouped_on_cuda(Device& dev, const char* op, std::initializer_list<const Tensor*> tensors,
                     const Tensor& operand, const Tensor& result, const Tensor& group_sizes,
                     int64_t rows, Kernel&& kernel, Loop&& loop) {
  const bool sizes_on_host = !group_sizes.device().is_cuda();
  if (!sizes_on_host) op_stream(dev, op, {&group_sizes});
  if (operand.dtype() == DType::kBF16) {
    const cudaStream_t stream = op_stream(dev, op, tensors);
    const cuda::GroupSizes sizes{static_cast<const int32_t*>(group_sizes.raw_data()),
                                 sizes_on_host};
    with_cuda_type(result, [&](auto result_type) { kernel(sizes, stream, result_type); });
    return;
  }
  const Tensor host_sizes = sizes_on_host ? group_sizes : group_sizes.on_host();
  if (!sizes_on_host) check_host_sizes(host_sizes, rows);
  loop(op_blas(dev, op, tensors), host_sizes.data<int32_t>());
}
#endif

}  // namespace

void matmul(Device& dev, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha, float beta) {
  check_types("matmul", a, b, c);
  const MatrixShape sa = matrix_shape(a), sb = matrix_shape(b), sc = matrix_shape(c);
  const int64_t m = trans_a ? sa.cols : sa.rows;
  const int64_t k = trans_a ? sa.rows : sa.cols;
  const int64_t n = trans_b ? sb.rows : sb.cols;
  SY_CHECK_MSG((trans_b ? sb.cols : sb.rows) == k, "matmul: inner dimensions differ");
  SY_CHECK_MSG(sc.rows == m && sc.cols == n, "matmul: output shape does not match");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::gemm(op_blas(dev, "matmul", {&a, &b, &c}), trans_a, trans_b, m, n, k, alpha, a.raw_data(),
               sa.cols, b.raw_data(), sb.cols, beta, c.raw_data(), sc.cols, gemm_types(a, c));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "matmul: this build has no CUDA backend");
  if (any_bf16({&a, &c})) {
    Tensor result = widened(c);
    matmul(dev, widened(a), trans_a, widened(b), trans_b, result, alpha, beta);
    store(dev, result, c);
    return;
  }
  cpu::gemm<float>(trans_a, trans_b, m, n, k, alpha, a.data<float>(), sa.cols, b.data<float>(),
                   sb.cols, beta, c.data<float>(), sc.cols);
}

Tensor group_sizes_for(Device& dev, DType operand, const Tensor& sizes) {
  const bool host_sized = dev.is_cuda() && operand == DType::kF32 && sizes.device().is_cuda();
  return host_sized ? sizes.on_host() : sizes;
}

void grouped_matmul_nt(Device& dev, const Tensor& a, const Tensor& w, const Tensor& group_sizes,
                       Tensor& out) {
  check_types("grouped_matmul_nt", a, w, out);
  SY_CHECK_MSG(w.rank() == 3, "grouped_matmul_nt: w must be (G, N, K)");
  const int64_t groups = w.dim(0), n = w.dim(1), k = w.dim(2);
  const MatrixShape sa = matrix_shape(a), so = matrix_shape(out);
  SY_CHECK_MSG(sa.cols == k && so.rows == sa.rows && so.cols == n,
               "grouped_matmul_nt: shapes do not match");
  SY_CHECK_MSG(check_groups(dev, group_sizes, sa.rows) == groups,
               "grouped_matmul_nt: one group size per weight matrix");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    grouped_on_cuda(
        dev, "grouped_matmul_nt", {&a, &w, &out}, a, out, group_sizes, sa.rows,
        [&](cuda::GroupSizes sizes, cudaStream_t stream, auto out_type) {
          using Out = typename decltype(out_type)::type;
          cuda::grouped_gemm_nt(bf16_data(a), bf16_data(w), sizes, sa.rows, groups, n, k,
                                cuda_data<Out>(out), stream);
        },
        [&](cuda::Blas& blas, const int32_t* host_sizes) {
          cuda::grouped_matmul_nt(blas, a.raw_data(), w.raw_data(), host_sizes, groups, n, k,
                                  out.raw_data(), gemm_types(a, out));
        });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "grouped_matmul_nt: this build has no CUDA backend");
  if (any_bf16({&a, &out})) {
    Tensor result = widened(out);
    grouped_matmul_nt(dev, widened(a), widened(w), group_sizes, result);
    store(dev, result, out);
    return;
  }
  cpu::grouped_matmul_nt<float>(a.data<float>(), w.data<float>(), group_sizes.data<int32_t>(),
                                groups, n, k, out.data<float>());
}

void grouped_matmul_nn(Device& dev, const Tensor& a, const Tensor& w, const Tensor& group_sizes,
                       Tensor& out) {
  check_types("grouped_matmul_nn", a, w, out);
  SY_CHECK_MSG(w.rank() == 3, "grouped_matmul_nn: w must be (G, N, K)");
  const int64_t groups = w.dim(0), n = w.dim(1), k = w.dim(2);
  const MatrixShape sa = matrix_shape(a), so = matrix_shape(out);
  SY_CHECK_MSG(sa.cols == n && so.rows == sa.rows && so.cols == k,
               "grouped_matmul_nn: shapes do not match");
  SY_CHECK_MSG(check_groups(dev, group_sizes, sa.rows) == groups,
               "grouped_matmul_nn: one group size per weight matrix");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    grouped_on_cuda(
        dev, "grouped_matmul_nn", {&a, &w, &out}, a, out, group_sizes, sa.rows,
        [&](cuda::GroupSizes sizes, cudaStream_t stream, auto out_type) {
          using Out = typename decltype(out_type)::type;
          cuda::grouped_gemm_nn(bf16_data(a), bf16_data(w), sizes, sa.rows, groups, n, k,
                                cuda_data<Out>(out), stream);
        },
        [&](cuda::Blas& blas, const int32_t* host_sizes) {
          cuda::grouped_matmul_nn(blas, a.raw_data(), w.raw_data(), host_sizes, groups, n, k,
                                  out.raw_data(), gemm_types(a, out));
        });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "grouped_matmul_nn: this build has no CUDA backend");
  if (any_bf16({&a, &out})) {
    Tensor result = widened(out);
    grouped_matmul_nn(dev, widened(a), widened(w), group_sizes, result);
    store(dev, result, out);
    return;
  }
  cpu::grouped_matmul_nn<float>(a.data<float>(), w.data<float>(), group_sizes.data<int32_t>(),
                                groups, n, k, out.data<float>());
}

void grouped_matmul_tn_accumulate(Device& dev, const Tensor& a, const Tensor& b,
                                  const Tensor& group_sizes, Tensor& dw) {
  check_types("grouped_matmul_tn_accumulate", a, b, dw);
  SY_CHECK_MSG(dw.rank() == 3, "grouped_matmul_tn_accumulate: dw must be (G, N, K)");
  const int64_t groups = dw.dim(0), n = dw.dim(1), k = dw.dim(2);
  const MatrixShape sa = matrix_shape(a), sb = matrix_shape(b);
  SY_CHECK_MSG(sa.cols == n && sb.cols == k && sb.rows == sa.rows,
               "grouped_matmul_tn_accumulate: shapes do not match");
  SY_CHECK_MSG(check_groups(dev, group_sizes, sa.rows) == groups,
               "grouped_matmul_tn_accumulate: one group size per weight matrix");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    grouped_on_cuda(
        dev, "grouped_matmul_tn_accumulate", {&a, &b, &dw}, a, dw, group_sizes, sa.rows,
        [&](cuda::GroupSizes sizes, cudaStream_t stream, auto dw_type) {
          using Out = typename decltype(dw_type)::type;
          cuda::grouped_gemm_tn_accumulate(bf16_data(a), bf16_data(b), sizes, sa.rows, groups, n, k,
                                           cuda_data<Out>(dw), stream);
        },
        [&](cuda::Blas& blas, const int32_t* host_sizes) {
          cuda::grouped_matmul_tn_accumulate(blas, a.raw_data(), b.raw_data(), host_sizes, groups,
                                             n, k, dw.raw_data(), gemm_types(a, dw));
        });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "grouped_matmul_tn_accumulate: this build has no CUDA backend");
  if (any_bf16({&a, &dw})) {
    Tensor result = widened(dw);
    grouped_matmul_tn_accumulate(dev, widened(a), widened(b), group_sizes, result);
    store(dev, result, dw);
    return;
  }
  cpu::grouped_matmul_tn_accumulate<float>(a.data<float>(), b.data<float>(),
                                           group_sizes.data<int32_t>(), groups, n, k,
                                           dw.data<float>());
}

}  // namespace switchyard
