#include "moe/tensor_parallel_sum.h"

#include "kernels/convert.h"

namespace switchyard {

void tensor_parallel_sum(Device& dev, Communicator& group, Tensor& partial) {
  if (partial.dtype() == DType::kF32) {
    group.all_reduce_sum(partial);
    return;
  }
  Tensor sum = widened(partial);
  group.all_reduce_sum(sum);
  convert(dev, sum, partial);
}

}  // namespace switchyard
