// CUDA sums and gradient of the sequence-wise auxiliary loss (twins of
// kernels/cpu/sequence_aux.h; kernels/sequence_aux.h says what they compute). fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// One block per (sequence, expert), summed in double in a fixed order.
void sequence_routing_sums(const float* probs, const int32_t* expert_ids, int64_t n,
                           int64_t experts, int64_t k, bool normalize, int64_t first_token,
                           int64_t seq_len, int64_t sequences, float* sums, cudaStream_t stream);
// One thread per row.
void sequence_aux_backward(const float* probs, const float* sums, int64_t n, int64_t experts,
                           bool normalize, int64_t first_token, int64_t seq_len, float scale,
                           float* dlogits, cudaStream_t stream);

}  // namespace switchyard::cuda
