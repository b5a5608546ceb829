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
#include <vector>

namespace switchyard::cpu {

namespace fixed_order {

constexpr int64_t kRows = 4;     // rows of c per tile
constexpr int64_t kCols = 32;    // columns of c per tile

// One tile of c: all kRows x kCols elements when Full, else the first rows x cols (the
// edges), with the same additions. b is (K, N) row-major with stride ldb; a(i0 + r, kk)
// is a[r * a_row + kk * a_k].
template <typename T, bool Full>
inline void tile(const T* a, int64_t a_row, int64_t a_k, const T* b, int64_t ldb, int64_t k,
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
      const T av = r < rows ? a[r * a_row + kk * a_k] : T(0);
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

}  // namespace fixed_order

// Same contract as gemm() (kernels/cpu/gemm.h), in the fixed order above.
template <typename T>
void gemm_fixed_order(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                      const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                      int64_t ldc) {
  using namespace fixed_order;
  // op(b) as a (K, N) row-major matrix: a transposed b is copied once, which moves values
  // and adds nothing.
  std::vector<T> packed;
  const T* bk = b;
  int64_t ldbk = ldb;
  if (trans_b) {
    packed.resize(static_cast<size_t>(k * n));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t kk = 0; kk < k; ++kk) packed[kk * n + j] = b[j * ldb + kk];
    }
    bk = packed.data();
    ldbk = n;
  }
  const bool chain_from_c = alpha == T(1) && beta == T(1);
  const int64_t row_tiles = (m + kRows - 1) / kRows;
  const int64_t col_tiles = (n + kCols - 1) / kCols;
  const int64_t tiles = row_tiles * col_tiles;
  // Each element belongs to one tile, computed by one thread: the split between threads
  // changes who adds, never the order.
#pragma omp parallel for schedule(static) if (m * n * k >= (int64_t{1} << 16))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = (t / col_tiles) * kRows, j0 = (t % col_tiles) * kCols;
    const int64_t rows = std::min(kRows, m - i0), cols = std::min(kCols, n - j0);
    const T* at = trans_a ? a + i0 : a + i0 * lda;
    const int64_t a_row = trans_a ? 1 : lda, a_k = trans_a ? lda : 1;
    T* ct = c + i0 * ldc + j0;
    if (rows == kRows && cols == kCols) {
      tile<T, true>(at, a_row, a_k, bk + j0, ldbk, k, chain_from_c, alpha, beta, ct, ldc, rows,
                    cols);
    } else {
      tile<T, false>(at, a_row, a_k, bk + j0, ldbk, k, chain_from_c, alpha, beta, ct, ldc, rows,
                     cols);
    }
  }
}

}  // namespace switchyard::cpu
