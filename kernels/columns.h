// Column blocks of row-major matrices: how a layer assembles per-head operands from
// several projections (multi-head latent attention joins each head's position-free and
// rotary channels, and shares one rotary key across heads) and splits their gradients
// back. Tensors of rank > 2 are read as matrices whose column count is the last
// dimension and whose row count is everything before it.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// dst[:, dst_col + j] = src[:, src_col + j] for j < width. src and dst have the same row
// count and one dtype, f32 or bf16; the other columns of dst are left as they are.
void copy_columns(Device& dev, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                  int64_t width);
// dst[:, dst_col + j] += src[:, src_col + j]: the backward of copying one block into
// several places (with bf16, added in f32 and rounded once).
void add_columns(Device& dev, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                 int64_t width);

}  // namespace switchyard
