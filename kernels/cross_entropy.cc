#include "kernels/cross_entropy.h"

#include "kernels/convert.h"
#include "kernels/cpu/cross_entropy.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace switchyard {
namespace {

// The size of the vocabulary the targets index: the shard's `whole`, or the logits' width.
int64_t whole_vocab(const Tensor& logits, VocabShard shard) {
  return shard.whole > 0 ? shard.whole : logits.dim(1);
}

// Returns the row count after checking logits (n, vocab shard) against targets (n).
int64_t check_operands(const Tensor& logits, const Tensor& targets, VocabShard shard = {}) {
  SY_CHECK_MSG(logits.rank() == 2 && logits.dtype() == DType::kF32 && logits.dim(1) > 0,
               "cross_entropy: logits must be f32 (n, vocab)");
  SY_CHECK_MSG(
      targets.rank() == 1 && targets.dtype() == DType::kI32 && targets.dim(0) == logits.dim(0),
      "cross_entropy: targets must be i32 (n)");
  SY_CHECK_MSG(shard.start >= 0 && shard.start + logits.dim(1) <= whole_vocab(logits, shard),
               "cross_entropy: the vocabulary shard lies outside the vocabulary");
  return logits.dim(0);
}

// Targets lie below the whole vocabulary (negative: ignored); checked here on the CPU, on
// the device by the CUDA kernels, as the targets of a CUDA tensor cannot be read here.
void check_target_values(const Tensor& targets, int64_t whole) {
  const int32_t* t = targets.data<int32_t>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    SY_CHECK_MSG(t[r] < whole, "cross_entropy: target outside the vocabulary");
  }
}

}  // namespace

void cross_entropy_forward(Device& dev, const Tensor& logits, const Tensor& targets, Tensor& losses,
                           Tensor& lse) {
  const int64_t n = check_operands(logits, targets);
  SY_CHECK_MSG(losses.numel() == n && lse.numel() == n,
               "cross_entropy_forward: losses and lse must be (n)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::cross_entropy_forward(
        logits.data<float>(), targets.data<int32_t>(), n, logits.dim(1), losses.data<float>(),
        lse.data<float>(),
        op_stream(dev, "cross_entropy_forward", {&logits, &targets, &losses, &lse}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "cross_entropy_forward: this build has no CUDA backend");
  check_target_values(targets, logits.dim(1));
  cpu::cross_entropy_forward<float>(logits.data<float>(), targets.data<int32_t>(), n, logits.dim(1),
                                    losses.data<float>(), lse.data<float>());
}

void cross_entropy_backward(Device& dev, const Tensor& logits, const Tensor& targets,
                            const Tensor& lse, float scale, Tensor& dlogits, VocabShard shard) {
  const int64_t n = check_operands(logits, targets, shard);
  SY_CHECK_MSG(lse.numel() == n && dlogits.shape() == logits.shape(),
               "cross_entropy_backward: lse must be (n) and dlogits like logits");
  SY_CHECK_MSG(dlogits.dtype() == DType::kF32 || dlogits.dtype() == DType::kBF16,
               "cross_entropy_backward: dlogits must be f32 or bf16");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream =
        op_stream(dev, "cross_entropy_backward", {&logits, &targets, &lse, &dlogits});
    const auto launch = [&](auto* gradient) {
      cuda::cross_entropy_backward(logits.data<float>(), targets.data<int32_t>(), lse.data<float>(),
                                   scale, n, logits.dim(1), shard.start, whole_vocab(logits, shard),
                                   gradient, stream);
    };
    if (dlogits.dtype() == DType::kBF16)
      launch(static_cast<__nv_bfloat16*>(dlogits.raw_data()));
    else
      launch(dlogits.data<float>());
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "cross_entropy_backward: this build has no CUDA backend");
  if (dlogits.dtype() == DType::kBF16) {
    Tensor gradient =
        Tensor::empty(dlogits.shape(), DType::kF32, MemoryKind::kActivations, dlogits.device());
    cross_entropy_backward(dev, logits, targets, lse, scale, gradient, shard);
    store(dev, gradient, dlogits);
    return;
  }
  check_target_values(targets, whole_vocab(logits, shard));
  cpu::cross_entropy_backward<float>(logits.data<float>(), targets.data<int32_t>(),
                                     lse.data<float>(), scale, n, logits.dim(1), shard.start,
                                     dlogits.data<float>());
}

void cross_entropy_shard_forward(Device& dev, const Tensor& logits, const Tensor& targets,
                                 VocabShard shard, Tensor& lse, Tensor& target_logits) {
  const int64_t n = check_operands(logits, targets, shard);
  SY_CHECK_MSG(lse.numel() == n && target_logits.numel() == n,
               "cross_entropy_shard_forward: lse and target_logits must be (n)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::cross_entropy_shard_forward(
        logits.data<float>(), targets.data<int32_t>(), n, logits.dim(1), shard.start,
        whole_vocab(logits, shard), lse.data<float>(), target_logits.data<float>(),
        op_stream(dev, "cross_entropy_shard_forward", {&logits, &targets, &lse, &target_logits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "cross_entropy_shard_forward: this build has no CUDA backend");
  check_target_values(targets, whole_vocab(logits, shard));
  cpu::cross_entropy_shard_forward<float>(logits.data<float>(), targets.data<int32_t>(), n,
                                          logits.dim(1), shard.start, lse.data<float>(),
                                          target_logits.data<float>());
}

}  // namespace switchyard
