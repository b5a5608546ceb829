// Precision conversions: f32 <-> bf16 on any device, and the CPU's way of running an
// op on bf16 operands.
#pragma once

#include <initializer_list>

#include "core/runtime/tensor.h"

namespace switchyard {

// dst = src element-wise (same numel, same device), f32 and bf16 in any direction:
// narrowing rounds to nearest even, widening is exact; equal dtypes copy. Also i32 to f32
// (counts: exact up to 2^24).
void convert(Device& dev, const Tensor& src, Tensor& dst);

// The CPU runs an op on bf16 operands in f32: inputs are widened (exactly) to f32
// copies, the f32 op runs, and each output is rounded to bf16 once, as the CUDA kernels
// compute in f32 between bf16 loads and stores.
bool any_bf16(std::initializer_list<const Tensor*> tensors);
// Whether `t` holds f32 or bf16, the dtypes the ops compute on.
bool is_float(const Tensor& t);
// `t` itself when it is f32, else an f32 copy on the same device.
Tensor widened(const Tensor& t);
// Where the f32 op writes an output before it is stored into `out`: `out` itself when
// it is f32, else a new f32 tensor (for outputs that are written, never read, so there
// is nothing to widen).
Tensor f32_result(const Tensor& out);
// Writes the f32 `values` into `out` (rounded when `out` is bf16); nothing to do when
// `out` is `values`.
void store(Device& dev, const Tensor& values, Tensor& out);

}  // namespace switchyard
