// CPU token embedding lookup and its gradient.
#pragma once

#include <algorithm>
#include <cstdint>

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

// dtable: (vocab, hidden) += dout rows scattered by ids (negative ids are skipped).
// Threads own blocks of columns
// and walk the tokens in order, so repeated ids add up in the same order for any
// thread count.
template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, int64_t n, int64_t hidden, T* dtable) {
  constexpr int64_t kBlock = 256;
  const int64_t num_blocks = (hidden + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * hidden >= kParallelMinWork)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock;
    const int64_t width = std::min(kBlock, hidden - begin);
    for (int64_t t = 0; t < n; ++t) {
      if (ids[t] < 0) continue;
      T* dst = dtable + static_cast<int64_t>(ids[t]) * hidden + begin;
      const T* src = dout + t * hidden + begin;
      for (int64_t i = 0; i < width; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace switchyard::cpu
