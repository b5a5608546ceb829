// The tensor-parallel sum of partial activations (row-parallel outputs, input
// gradients of column-parallel layers) in any compute dtype.
#pragma once

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// In place: `partial` becomes its sum over `group`. f32 sums directly; bf16 is summed in
// f32 (each rank's rounded partial widened exactly) and rounded once at the end.
void tensor_parallel_sum(Device& dev, Communicator& group, Tensor& partial);

}  // namespace switchyard
