#include "kernels/cuda/gemm.h"

#include <cuda_runtime_api.h>

#include <climits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace switchyard::cuda {
namespace {

template <typename T>
struct CublasType;
template <>
struct CublasType<float> {
  static constexpr cudaDataType_t value = CUDA_R_32F;
};

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

}  // namespace

// cuBLAS is column-major: a row-major (r, c) matrix with row stride ld is its (c, r)
// transpose there. So row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, i.e. with the operands swapped and the same transpose flags.
template <typename T>
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const T* a, int64_t lda, const T* b, int64_t ldb, float beta, T* c,
          int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // The product is empty (and cuBLAS rejects the zero leading dimensions an empty
    // operand brings): only the beta scaling remains.
    if (beta == 1.0f) return;
    cudaStream_t stream = nullptr;
    SY_CUBLAS_CHECK(cublasGetStream(handle, &stream));
    scale_matrix_kernel<<<grid_blocks(m * n), kThreads, 0, stream>>>(c, m, n, ldc, beta);
    SY_CUDA_CHECK_LAUNCH();
    return;
  }
  const cudaDataType_t type = CublasType<T>::value;
  SY_CUBLAS_CHECK(cublasGemmEx(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      as_blas_int(n), as_blas_int(m), as_blas_int(k), &alpha, b, type, as_blas_int(ldb), a, type,
      as_blas_int(lda), &beta, c, type, as_blas_int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <typename T>
void grouped_matmul_nt(cublasHandle_t handle, const T* a, const T* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, T* out) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm<T>(handle, false, true, host_sizes[g], n, k, 1.0f, a + row * k, k, w + g * n * k, k, 0.0f,
            out + row * n, n);
    row += host_sizes[g];
  }
}

template <typename T>
void grouped_matmul_nn(cublasHandle_t handle, const T* a, const T* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, T* out) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm<T>(handle, false, false, host_sizes[g], k, n, 1.0f, a + row * n, n, w + g * n * k, k, 0.0f,
            out + row * k, k);
    row += host_sizes[g];
  }
}

template <typename T>
void grouped_matmul_tn_accumulate(cublasHandle_t handle, const T* a, const T* b,
                                  const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k,
                                  T* dw) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm<T>(handle, true, false, n, k, host_sizes[g], 1.0f, a + row * n, n, b + row * k, k, 1.0f,
            dw + g * n * k, k);
    row += host_sizes[g];
  }
}

template void gemm<float>(cublasHandle_t, bool, bool, int64_t, int64_t, int64_t, float,
                          const float*, int64_t, const float*, int64_t, float, float*, int64_t);
template void grouped_matmul_nt<float>(cublasHandle_t, const float*, const float*, const int32_t*,
                                       int64_t, int64_t, int64_t, float*);
template void grouped_matmul_nn<float>(cublasHandle_t, const float*, const float*, const int32_t*,
                                       int64_t, int64_t, int64_t, float*);
template void grouped_matmul_tn_accumulate<float>(cublasHandle_t, const float*, const float*,
                                                  const int32_t*, int64_t, int64_t, int64_t,
                                                  float*);

}  // namespace switchyard::cuda
