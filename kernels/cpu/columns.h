// CPU column-block copies (kernels/columns.h) on raw pointers.
#pragma once

#include <cstdint>

namespace switchyard::cpu {

// dst[r * ld_dst + j] = src[r * ld_src + j] for r < rows, j < width; the pointers point at
// the blocks' first columns.
template <typename T>
void copy_columns(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows,
                  int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) dst[r * ld_dst + j] = src[r * ld_src + j];
}

// dst[r * ld_dst + j] += src[r * ld_src + j].
template <typename T>
void add_columns(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t rows,
                 int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) dst[r * ld_dst + j] += src[r * ld_src + j];
}

}  // namespace switchyard::cpu
