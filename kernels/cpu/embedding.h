// CPU token embedding lookup and its gradient.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cpu/elementwise.h"

namespace switchyard::cpu {

// ids: (n), table: (vocab, hidden) -> out: (n, hidden); a negative id gives zeros.
template <typename T>
void embedding_forward(const int32_t* ids, const T* table, int64_t n, int64_t hidden, T* out) {
#pragma omp parallel for schedule(static) if (n * hidden >= kParallelMinWork)
  for (int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0)
      std::fill_n(out + t * hidden, hidden, T(0));
    else
      std::copy_n(table + static_cast<int64_t>(ids[t]) * hidden, hidden, out + t * hidden);
  }
}

// Repeated ids add up in pieces: the tokens sorted by id (stably, skipped ones last) are
// cut at every multiple of kEmbeddingPiece positions, each piece of an id's tokens is
// summed in token order from zero, and the pieces are added to the id's row in order.
// The GPU sums the pieces in parallel and adds them the same way, so both give the same
// bits; a long run of one id is no serial chain there.
inline constexpr int64_t kEmbeddingPiece = 32;

// dtable: (vocab, hidden) += dout rows scattered by ids (negative ids are skipped), in
// kEmbeddingPiece pieces. Threads own blocks of columns, so the sums do not depend on
// the thread count.
template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, int64_t n, int64_t hidden, T* dtable) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  // Negative ids as unsigned sort last, as the GPU's keys do.
  auto key = [&](int64_t t) { return static_cast<uint32_t>(ids[t]); };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return key(x) < key(y); });
  constexpr int64_t kBlock = 256;
  const int64_t num_blocks = (hidden + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * hidden >= kParallelMinWork)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t width = std::min(kBlock, hidden - begin);
    T piece[kBlock];
    for (int64_t p = 0; p < n;) {
      const int32_t id = ids[order[p]];
      if (id < 0) break;
      T* dst = dtable + static_cast<int64_t>(id) * hidden + begin;
      while (p < n && ids[order[p]] == id) {
        const int64_t piece_end = std::min(n, (p / kEmbeddingPiece + 1) * kEmbeddingPiece);
        std::fill_n(piece, width, T(0));
        for (; p < piece_end && ids[order[p]] == id; ++p) {
          const T* src = dout + order[p] * hidden + begin;
          for (int64_t i = 0; i < width; ++i) piece[i] += src[i];
        }
        for (int64_t i = 0; i < width; ++i) dst[i] += piece[i];
      }
    }
  }
}

}  // namespace switchyard::cpu
