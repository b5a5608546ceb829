// Matrix products whose every output element is added in one fixed order: the batch-
// invariant mode's products (runtime.batch_invariant; docs/determinism.md).
//
// c(i, j) gets a(i, 0) b(0, j), a(i, 1) b(1, j), ..., a(i, K-1) b(K-1, j) added one after
// another, each by a fused multiply-add, whatever M and N are, which other rows and
// columns share the call, how the threads split the work and which CPU runs it. So a
// row's product does not depend on the batch it is in. With alpha = beta = 1 the chain
// starts from c(i, j) itself: a sum over rows (a weight gradient over tokens) cut into
// several calls, one per micro-batch in order, gives the bits of one call over all rows.
// Otherwise the chain starts from 0 and c = alpha * chain + beta * c.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace switchyard::cpu {

namespace fixed_order {

constexpr int64_t kRows = 6;   // rows of c per tile
constexpr int64_t kCols = 16;  // columns of c per tile

// One tile of c: all kRows x kCols elements when Full, else the first rows x cols (the
// edges), with the same additions. a is (rows, K) and b (K, N), row-major with strides
// lda and ldb.
template <typename T, bool Full>
inline void tile(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t k,
                 bool chain_from_c, T alpha, T beta, T* c, int64_t ldc, int64_t rows,
                 int64_t cols) {
  if constexpr (Full) rows = kRows, cols = kCols;
  T acc[kRows][kCols];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kCols; ++j) {
      acc[r][j] = chain_from_c && r < rows && j < cols ? c[r * ldc + j] : T(0);
    }
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const T* brow = b + kk * ldb;
    T bv[kCols];
    for (int64_t j = 0; j < kCols; ++j) bv[j] = j < cols ? brow[j] : T(0);
    for (int64_t r = 0; r < kRows; ++r) {
      const T av = r < rows ? a[r * lda + kk] : T(0);
      for (int64_t j = 0; j < kCols; ++j) acc[r][j] = std::fma(av, bv[j], acc[r][j]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      T& out = c[r * ldc + j];
      if (chain_from_c) {
        out = acc[r][j];
      } else if (beta == T(0)) {
        out = alpha * acc[r][j];
      } else {
        out = std::fma(alpha, acc[r][j], beta * out);
      }
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// A whole f32 tile in AVX2 registers: the additions of tile<float, true>, eight lanes at a
// time (a fused multiply-add rounds once whether one lane or eight run it).
inline void tile_avx2(const float* a, int64_t lda, const float* b, int64_t ldb,
                      int64_t k, bool chain_from_c, float alpha, float beta, float* c,
                      int64_t ldc) {
  static_assert(kCols == 16);
  __m256 acc[kRows][2];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t h = 0; h < 2; ++h)
      acc[r][h] = chain_from_c ? _mm256_loadu_ps(c + r * ldc + 8 * h) : _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * ldb), b1 = _mm256_loadu_ps(b + kk * ldb + 8);
    for (int64_t r = 0; r < kRows; ++r) {
      const __m256 av = _mm256_set1_ps(a[r * lda + kk]);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t h = 0; h < 2; ++h) {
      float* out = c + r * ldc + 8 * h;
      __m256 v = acc[r][h];
      if (!chain_from_c) {
        v = beta == 0.0f ? _mm256_mul_ps(va, v)
                         : _mm256_fmadd_ps(va, v, _mm256_mul_ps(vb, _mm256_loadu_ps(out)));
      }
      _mm256_storeu_ps(out, v);
    }
  }
}
#endif

// x^T of a (rows, cols) row-major matrix with row stride ld, as a (cols, rows) row-major
// copy: it moves values and adds nothing.
template <typename T>
std::vector<T> transposed(const T* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<T> t(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * ld + j];
  }
  return t;
}

}  // namespace fixed_order

// Same contract as gemm() (kernels/cpu/gemm.h), in the fixed order above.
template <typename T>
void gemm_fixed_order(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                      const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                      int64_t ldc) {
  using namespace fixed_order;
  // op(a) as an (M, K) and op(b) as a (K, N) row-major matrix, so that a tile reads each
  // of its rows in order.
  std::vector<T> a_rows, b_rows;
  if (trans_a) {
    a_rows = transposed(a, k, m, lda);
    a = a_rows.data();
    lda = k;
  }
  if (trans_b) {
    b_rows = transposed(b, n, k, ldb);
    b = b_rows.data();
    ldb = n;
  }
  const bool chain_from_c = alpha == T(1) && beta == T(1);
  const int64_t row_tiles = (m + kRows - 1) / kRows;
  const int64_t col_tiles = (n + kCols - 1) / kCols;
  const int64_t tiles = row_tiles * col_tiles;
  // Each element belongs to one tile, computed by one thread: the split between threads
  // changes who adds, never the order.
#pragma omp parallel for schedule(static) if (m * n * k >= (int64_t{1} << 16))
  for (int64_t t = 0; t < tiles; ++t) {
    // Row tiles vary fastest: consecutive tiles read one strip of b, which stays in cache.
    const int64_t i0 = (t % row_tiles) * kRows, j0 = (t / row_tiles) * kCols;
    const int64_t rows = std::min(kRows, m - i0), cols = std::min(kCols, n - j0);
    const T* at = a + i0 * lda;
    T* ct = c + i0 * ldc + j0;
    if (rows == kRows && cols == kCols) {
#if defined(__AVX2__) && defined(__FMA__)
      if constexpr (std::is_same_v<T, float>) {
        tile_avx2(at, lda, b + j0, ldb, k, chain_from_c, alpha, beta, ct, ldc);
        continue;
      }
#endif
      tile<T, true>(at, lda, b + j0, ldb, k, chain_from_c, alpha, beta, ct, ldc, rows,
                    cols);
    } else {
      tile<T, false>(at, lda, b + j0, ldb, k, chain_from_c, alpha, beta, ct, ldc, rows,
                     cols);
    }
  }
}

}  // namespace switchyard::cpu
