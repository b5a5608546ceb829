// CUDA matrix products (twins of kernels/cpu/gemm.h) through cuBLAS with fp32 compute, on
// the stream the cuBLAS handle is bound to. Row-major operands; templates on the element
// type, instantiated for float.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace switchyard::cuda {

// c = alpha * op(a) @ op(b) + beta * c with op(a): (m, k), op(b): (k, n), c: (m, n); lda,
// ldb, ldc are the row strides of the stored (untransposed) matrices. With beta == 0, c
// is only written (stale NaNs there do not propagate).
template <typename T>
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const T* a, int64_t lda, const T* b, int64_t ldb, float beta, T* c,
          int64_t ldc);

// Grouped products, one cuBLAS call per non-empty group. `host_sizes` is host memory:
// the row offsets decide the pointers of each call.
// out_g = a_g @ w[g]^T; a: (R, K), w: (G, N, K), out: (R, N), written.
template <typename T>
void grouped_matmul_nt(cublasHandle_t handle, const T* a, const T* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, T* out);
// out_g = a_g @ w[g]; a: (R, N), w: (G, N, K), out: (R, K), written.
template <typename T>
void grouped_matmul_nn(cublasHandle_t handle, const T* a, const T* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, T* out);
// dw[g] += a_g^T @ b_g; a: (R, N), b: (R, K), dw: (G, N, K), accumulated.
template <typename T>
void grouped_matmul_tn_accumulate(cublasHandle_t handle, const T* a, const T* b,
                                  const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k,
                                  T* dw);

}  // namespace switchyard::cuda
