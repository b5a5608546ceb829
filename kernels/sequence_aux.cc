#include "kernels/sequence_aux.h"

#include "kernels/cpu/sequence_aux.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/sequence_aux.h"
#endif

namespace switchyard {

namespace {
// The rows lie inside the batch that `sums` describes.
void check_rows(const Tensor& probs, const Tensor& sums, SequenceRows rows) {
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(rows.seq_len > 0 && rows.first_token >= 0);
  SY_CHECK(sums.rank() == 2 && sums.dim(1) == 2 * experts);
  SY_CHECK(rows.first_token + n <= sums.dim(0) * rows.seq_len);
}
}  // namespace

void sequence_routing_sums(Device& dev, const Tensor& probs, const Tensor& expert_ids,
                           bool normalize, SequenceRows rows, Tensor& sums) {
  check_rows(probs, sums, rows);
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(expert_ids.rank() == 2 && expert_ids.dim(0) == n);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::sequence_routing_sums(
        probs.data<float>(), expert_ids.data<int32_t>(), n, experts, expert_ids.dim(1), normalize,
        rows.first_token, rows.seq_len, sums.dim(0), sums.data<float>(),
        op_stream(dev, "sequence_routing_sums", {&probs, &expert_ids, &sums}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sequence_routing_sums: this build has no CUDA backend");
  cpu::sequence_routing_sums<float>(probs.data<float>(), expert_ids.data<int32_t>(), n, experts,
                                    expert_ids.dim(1), normalize, rows.first_token, rows.seq_len,
                                    sums.dim(0), sums.data<float>());
}

void sequence_aux_backward(Device& dev, const Tensor& probs, const Tensor& sums, bool normalize,
                           SequenceRows rows, float scale, Tensor& dlogits) {
  check_rows(probs, sums, rows);
  const int64_t n = probs.dim(0), experts = probs.dim(1);
  SY_CHECK(dlogits.numel() == n * experts);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::sequence_aux_backward(probs.data<float>(), sums.data<float>(), n, experts, normalize,
                                rows.first_token, rows.seq_len, scale, dlogits.data<float>(),
                                op_stream(dev, "sequence_aux_backward", {&probs, &sums, &dlogits}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sequence_aux_backward: this build has no CUDA backend");
  cpu::sequence_aux_backward<float>(probs.data<float>(), sums.data<float>(), n, experts, normalize,
                                    rows.first_token, rows.seq_len, scale, dlogits.data<float>());
}

}  // namespace switchyard
