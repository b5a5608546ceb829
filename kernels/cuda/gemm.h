// CUDA matrix products (twins of kernels/cpu/gemm.h) through cuBLAS with fp32 compute, on
// the stream the cuBLAS handle is bound to. Row-major operands of f32 or bf16: a and b
// share one type, c may be the other (bf16 operands with an f32 result give the router
// and LM-head logits and the weight gradients; f32 accumulation either way).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace switchyard::cuda {

struct GemmTypes {
  cudaDataType_t ab = CUDA_R_32F;  // CUDA_R_32F or CUDA_R_16BF
  cudaDataType_t c = CUDA_R_32F;
};

// c = alpha * op(a) @ op(b) + beta * c with op(a): (m, k), op(b): (k, n), c: (m, n); lda,
// ldb, ldc are the row strides of the stored (untransposed) matrices. With beta == 0, c
// is only written (stale NaNs there do not propagate).
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
          int64_t ldc, GemmTypes types);

// Grouped products, one cuBLAS call per non-empty group. `host_sizes` is host memory:
// the row offsets decide the pointers of each call.
// out_g = a_g @ w[g]^T; a: (R, K), w: (G, N, K), out: (R, N), written.
void grouped_matmul_nt(cublasHandle_t handle, const void* a, const void* w,
                       const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k, void* out,
                       GemmTypes types);
// out_g = a_g @ w[g]; a: (R, N), w: (G, N, K), out: (R, K), written.
void grouped_matmul_nn(cublasHandle_t handle, const void* a, const void* w,
                       const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k, void* out,
                       GemmTypes types);
// dw[g] += a_g^T @ b_g; a: (R, N), b: (R, K), dw: (G, N, K), accumulated.
void grouped_matmul_tn_accumulate(cublasHandle_t handle, const void* a, const void* b,
                                  const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k,
                                  void* dw, GemmTypes types);

}  // namespace switchyard::cuda
