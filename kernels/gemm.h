// Dense and grouped matrix products. Tensors of rank > 2 are read as matrices whose
// column count is the last dimension and whose row count is everything before it.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// c = alpha * op(a) @ op(b) + beta * c, op(x) = x^T when trans_x.
void matmul(Device& dev, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);

// Grouped products over row blocks: group g owns rows [offset_g, offset_g + sizes[g]) of
// the row-blocked operands, where offset_g = sizes[0] + ... + sizes[g-1]. The sizes add
// up to at most R: rows past their sum (a buffer sized for the most rows a routing plan
// can keep, whose count stays on the device) are neither read nor written.
// `group_sizes` is an i32 tensor of shape (G), on the host or, on a CUDA device, on the
// op's device. On CUDA, bf16 operands run the engine's tensor-core kernels
// (kernels/cuda/grouped_gemm.h), which read the sizes where they are: sizes on the device
// never reach the host, so the op does not wait for the stream (and a CUDA graph can
// capture it). f32 operands run one cuBLASLt product per non-empty group, sized on the
// host: sizes on the device are copied there first, which waits for the stream. On the
// CPU the sizes must be on the host.
//
// The group sizes to give a run of grouped products on `dev` with `operand` operands:
// `sizes` itself where those products read sizes where they are (the CPU; bf16 on CUDA),
// else a host copy made once (f32 on CUDA, whose cuBLASLt loop is sized on the host;
// this waits for the stream) instead of once per product.
Tensor group_sizes_for(Device& dev, DType operand, const Tensor& sizes);

// out_g = a_g @ w[g]^T          a: (R, K), w: (G, N, K), out: (R, N)   (written)
void grouped_matmul_nt(Device& dev, const Tensor& a, const Tensor& w, const Tensor& group_sizes,
                       Tensor& out);
// out_g = a_g @ w[g]            a: (R, N), w: (G, N, K), out: (R, K)   (written)
void grouped_matmul_nn(Device& dev, const Tensor& a, const Tensor& w, const Tensor& group_sizes,
                       Tensor& out);
// dw[g] += a_g^T @ b_g          a: (R, N), b: (R, K), dw: (G, N, K)    (accumulated)
void grouped_matmul_tn_accumulate(Device& dev, const Tensor& a, const Tensor& b,
                                  const Tensor& group_sizes, Tensor& dw);

}  // namespace switchyard
