// SwiGLU activation on a fused gate/up projection: each row of `gate_up` holds the
// gate half [0, I) then the up half [I, 2I); out = silu(gate) * up. All operands of a call
// are f32 or all bf16; with bf16 the arithmetic runs in f32 and each stored element is
// rounded once.
#pragma once

#include "core/runtime/tensor.h"

namespace switchyard {

// gate_up: (rows, 2I) -> out: (rows, I)
void swiglu_forward(Device& dev, const Tensor& gate_up, Tensor& out);
// dgate_up: (rows, 2I) written.
void swiglu_backward(Device& dev, const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up);

}  // namespace switchyard
