// CPU matrix products on row-major matrices through OpenBLAS, templates on the element
// type (float -> sgemm, double -> dgemm) so tests can run them in double; in the fixed
// order of kernels/cpu/fixed_order_gemm.h instead under runtime.batch_invariant.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/threads.h"

namespace switchyard::cpu {

// c = alpha * op(a) @ op(b) + beta * c with op(a): (m, k), op(b): (k, n), c: (m, n);
// lda, ldb, ldc are the row strides of the stored (untransposed) matrices.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS rejects the zero leading dimensions an empty operand brings; the product
    // is empty, so only the beta scaling remains.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  if (batch_invariant()) {
    gemm_fixed_order<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Grouped products: group g owns the next sizes[g] rows of the row-blocked operands.
// Groups run one after another and OpenBLAS (or the fixed-order kernel) threads each
// product.

// out_g = a_g @ w[g]^T; a: (R, K), w: (G, N, K), out: (R, N), written.
template <typename T>
void grouped_matmul_nt(const T* a, const T* w, const int32_t* sizes, int64_t groups, int64_t n,
                       int64_t k, T* out) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm<T>(false, true, sizes[g], n, k, T(1), a + row * k, k, w + g * n * k, k, T(0),
            out + row * n, n);
    row += sizes[g];
  }
}

// out_g = a_g @ w[g]; a: (R, N), w: (G, N, K), out: (R, K), written.
template <typename T>
void grouped_matmul_nn(const T* a, const T* w, const int32_t* sizes, int64_t groups, int64_t n,
                       int64_t k, T* out) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm<T>(false, false, sizes[g], k, n, T(1), a + row * n, n, w + g * n * k, k, T(0),
            out + row * k, k);
    row += sizes[g];
  }
}

// dw[g] += a_g^T @ b_g; a: (R, N), b: (R, K), dw: (G, N, K), accumulated.
template <typename T>
void grouped_matmul_tn_accumulate(const T* a, const T* b, const int32_t* sizes, int64_t groups,
                                  int64_t n, int64_t k, T* dw) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm<T>(true, false, n, k, sizes[g], T(1), a + row * n, n, b + row * k, k, T(1), dw + g * n * k,
            k);
    row += sizes[g];
  }
}

}  // namespace switchyard::cpu
