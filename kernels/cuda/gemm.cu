#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

// c = beta * c over an (m, n) block with row stride ldc; 0 (not 0 * c) when beta is 0.
template <typename T>
__global__ void scale_matrix_kernel(T* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  for (int64_t p = grid_start(); p < m * n; p += grid_stride()) {
    T* x = c + (p / n) * ldc + p % n;
    *x = beta == 0.0f ? static_cast<T>(0.0f) : static_cast<T>(beta * static_cast<float>(*x));
  }
}

int as_blas_int(int64_t v) {
  SY_CHECK_MSG(v <= INT_MAX, "gemm: a dimension exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

int64_t element_bytes(cudaDataType_t type) {
  SY_CHECK_MSG(type == CUDA_R_32F || type == CUDA_R_16BF, "gemm: f32 or bf16 operands only");
  return type == CUDA_R_32F ? 4 : 2;
}

// `p` advanced by `elements` elements of `type`.
template <typename Pointer>
Pointer offset(Pointer p, int64_t elements, cudaDataType_t type) {
  using Byte =
      std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const char, char>;
  return static_cast<Byte*>(p) + elements * element_bytes(type);
}

}  // namespace

// cuBLAS is column-major: a row-major (r, c) matrix with row stride ld is its (c, r)
// transpose there. So row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, i.e. with the operands swapped and the same transpose flags.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
          int64_t ldc, GemmTypes types) {
  element_bytes(types.ab);
  element_bytes(types.c);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // The product is empty (and cuBLAS rejects the zero leading dimensions an empty
    // operand brings): only the beta scaling remains.
    if (beta == 1.0f) return;
    cudaStream_t stream = nullptr;
    SY_CUBLAS_CHECK(cublasGetStream(handle, &stream));
    if (types.c == CUDA_R_32F)
      scale_matrix_kernel<<<grid_blocks(m * n), kThreads, 0, stream>>>(static_cast<float*>(c), m, n,
                                                                       ldc, beta);
    else
      scale_matrix_kernel<<<grid_blocks(m * n), kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(c), m, n, ldc, beta);
    SY_CUDA_CHECK_LAUNCH();
    return;
  }
  SY_CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_blas_int(n), as_blas_int(m),
                               as_blas_int(k), &alpha, b, types.ab, as_blas_int(ldb), a, types.ab,
                               as_blas_int(lda), &beta, c, types.c, as_blas_int(ldc),
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void grouped_matmul_nt(cublasHandle_t handle, const void* a, const void* w,
                       const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k, void* out,
                       GemmTypes types) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm(handle, false, true, host_sizes[g], n, k, 1.0f, offset(a, row * k, types.ab), k,
         offset(w, g * n * k, types.ab), k, 0.0f, offset(out, row * n, types.c), n, types);
    row += host_sizes[g];
  }
}

void grouped_matmul_nn(cublasHandle_t handle, const void* a, const void* w,
                       const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k, void* out,
                       GemmTypes types) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm(handle, false, false, host_sizes[g], k, n, 1.0f, offset(a, row * n, types.ab), n,
         offset(w, g * n * k, types.ab), k, 0.0f, offset(out, row * k, types.c), k, types);
    row += host_sizes[g];
  }
}

void grouped_matmul_tn_accumulate(cublasHandle_t handle, const void* a, const void* b,
                                  const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k,
                                  void* dw, GemmTypes types) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm(handle, true, false, n, k, host_sizes[g], 1.0f, offset(a, row * n, types.ab), n,
         offset(b, row * k, types.ab), k, 1.0f, offset(dw, g * n * k, types.c), k, types);
    row += host_sizes[g];
  }
}

}  // namespace switchyard::cuda
