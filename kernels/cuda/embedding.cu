#include "kernels/cuda/embedding.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/radix_sort.cuh"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

template <typename T>
__global__ void embedding_forward_kernel(const int32_t* ids, const T* table, int64_t n,
                                         int64_t vocab, int64_t hidden, T* out) {
  for (int64_t p = grid_start(); p < n * hidden; p += grid_stride()) {
    const int32_t id = ids[p / hidden];
    SY_DEVICE_CHECK(id >= -1 && id < vocab, "embedding: token id outside the vocabulary");
    out[p] = id < 0 ? static_cast<T>(0.0f) : table[static_cast<int64_t>(id) * hidden + p % hidden];
  }
}

// Sort keys: the id, or vocab for id -1, so the skipped tokens sort last.
__global__ void token_keys_kernel(const int32_t* ids, int64_t n, int64_t vocab, uint32_t* keys,
                                  int32_t* tokens) {
  for (int64_t t = grid_start(); t < n; t += grid_stride()) {
    const int32_t id = ids[t];
    SY_DEVICE_CHECK(id >= -1 && id < vocab, "embedding: token id outside the vocabulary");
    keys[t] = id < 0 ? static_cast<uint32_t>(vocab) : static_cast<uint32_t>(id);
    tokens[t] = static_cast<int32_t>(t);
  }
}

// One thread per (sorted position, column); the thread at the start of an id's run adds
// the run's rows (token order, thanks to the stable sort) onto dtable.
template <typename T>
__global__ void embedding_accumulate_kernel(const uint32_t* sorted_keys, const int32_t* tokens,
                                            const T* dout, int64_t n, int64_t vocab, int64_t hidden,
                                            float* dtable) {
  for (int64_t p = grid_start(); p < n * hidden; p += grid_stride()) {
    const int64_t first = p / hidden;
    const uint32_t id = sorted_keys[first];
    if (id == vocab || (first > 0 && sorted_keys[first - 1] == id)) continue;
    const int64_t c = p % hidden;
    float* dst = dtable + static_cast<int64_t>(id) * hidden + c;
    float acc = *dst;
    for (int64_t q = first; q < n && sorted_keys[q] == id; ++q)
      acc += static_cast<float>(dout[static_cast<int64_t>(tokens[q]) * hidden + c]);
    *dst = acc;
  }
}

}  // namespace

template <typename T>
void embedding_forward(const int32_t* ids, const T* table, int64_t n, int64_t vocab, int64_t hidden,
                       T* out, cudaStream_t stream) {
  if (n * hidden == 0) return;
  embedding_forward_kernel<<<grid_blocks(n * hidden), kThreads, 0, stream>>>(ids, table, n, vocab,
                                                                             hidden, out);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, int64_t n, int64_t vocab, int64_t hidden,
                        float* dtable, cudaStream_t stream) {
  if (n * hidden == 0) return;
  Scratch<uint32_t> keys(n, stream), sorted_keys(n, stream);
  Scratch<int32_t> tokens(n, stream), sorted_tokens(n, stream);
  token_keys_kernel<<<grid_blocks(n), kThreads, 0, stream>>>(ids, n, vocab, keys.get(),
                                                             tokens.get());
  SY_CUDA_CHECK_LAUNCH();
  // Keys lie in [0, vocab]; at least one bit, as a radix sort over none may not sort.
  const int key_bits = std::max(1, static_cast<int>(std::bit_width(static_cast<uint32_t>(vocab))));
  sort_pairs(keys.get(), sorted_keys.get(), tokens.get(), sorted_tokens.get(), n, key_bits, stream);
  embedding_accumulate_kernel<<<grid_blocks(n * hidden), kThreads, 0, stream>>>(
      sorted_keys.get(), sorted_tokens.get(), dout, n, vocab, hidden, dtable);
  SY_CUDA_CHECK_LAUNCH();
}

#define SY_INSTANTIATE_EMBEDDING(T)                                                                \
  template void embedding_forward<T>(const int32_t*, const T*, int64_t, int64_t, int64_t, T*,      \
                                     cudaStream_t);                                                \
  template void embedding_backward<T>(const int32_t*, const T*, int64_t, int64_t, int64_t, float*, \
                                      cudaStream_t);
SY_INSTANTIATE_EMBEDDING(float)
SY_INSTANTIATE_EMBEDDING(__nv_bfloat16)
#undef SY_INSTANTIATE_EMBEDDING

}  // namespace switchyard::cuda
