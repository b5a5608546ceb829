#include "kernels/cross_entropy.h"

#include "kernels/cpu/cross_entropy.h"

namespace switchyard {
namespace {

// Returns the row count after checking logits (n, vocab shard) against targets (n).
int64_t check_operands(const Tensor& logits, const Tensor& targets, VocabShard shard = {}) {
  SY_CHECK_MSG(logits.rank() == 2 && logits.dtype() == DType::kF32 && logits.dim(1) > 0,
               "cross_entropy: logits must be f32 (n, vocab)");
  SY_CHECK_MSG(
      targets.rank() == 1 && targets.dtype() == DType::kI32 && targets.dim(0) == logits.dim(0),
      "cross_entropy: targets must be i32 (n)");
  const int64_t whole = shard.whole > 0 ? shard.whole : logits.dim(1);
  SY_CHECK_MSG(shard.start >= 0 && shard.start + logits.dim(1) <= whole,
               "cross_entropy: the vocabulary shard lies outside the vocabulary");
  const int32_t* t = targets.data<int32_t>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    SY_CHECK_MSG(t[r] < whole, "cross_entropy: target outside the vocabulary");
  }
  return logits.dim(0);
}

}  // namespace

void cross_entropy_forward(Device& dev, const Tensor& logits, const Tensor& targets, Tensor& losses,
                           Tensor& lse) {
  SY_CHECK_MSG(!dev.is_cuda(), "cross_entropy_forward: no CUDA implementation yet");
  const int64_t n = check_operands(logits, targets);
  SY_CHECK_MSG(losses.numel() == n && lse.numel() == n,
               "cross_entropy_forward: losses and lse must be (n)");
  cpu::cross_entropy_forward<float>(logits.data<float>(), targets.data<int32_t>(), n, logits.dim(1),
                                    losses.data<float>(), lse.data<float>());
}

void cross_entropy_backward(Device& dev, const Tensor& logits, const Tensor& targets,
                            const Tensor& lse, float scale, Tensor& dlogits, VocabShard shard) {
  SY_CHECK_MSG(!dev.is_cuda(), "cross_entropy_backward: no CUDA implementation yet");
  const int64_t n = check_operands(logits, targets, shard);
  SY_CHECK_MSG(lse.numel() == n && dlogits.shape() == logits.shape(),
               "cross_entropy_backward: lse must be (n) and dlogits like logits");
  cpu::cross_entropy_backward<float>(logits.data<float>(), targets.data<int32_t>(),
                                     lse.data<float>(), scale, n, logits.dim(1), shard.start,
                                     dlogits.data<float>());
}

void cross_entropy_shard_forward(Device& dev, const Tensor& logits, const Tensor& targets,
                                 VocabShard shard, Tensor& lse, Tensor& target_logits) {
  SY_CHECK_MSG(!dev.is_cuda(), "cross_entropy_shard_forward: no CUDA implementation yet");
  const int64_t n = check_operands(logits, targets, shard);
  SY_CHECK_MSG(lse.numel() == n && target_logits.numel() == n,
               "cross_entropy_shard_forward: lse and target_logits must be (n)");
  cpu::cross_entropy_shard_forward<float>(logits.data<float>(), targets.data<int32_t>(), n,
                                          logits.dim(1), shard.start, lse.data<float>(),
                                          target_logits.data<float>());
}

}  // namespace switchyard
