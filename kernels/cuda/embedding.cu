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
                                            T* dtable) {
  for (int64_t p = grid_start(); p < n * hidden; p += grid_stride()) {
    const int64_t first = p / hidden;
    const uint32_t id = sorted_keys[first];
    if (id == vocab || (first > 0 && sorted_keys[first - 1] == id)) continue;
    const int64_t c = p % hidden;
    T* dst = dtable + static_cast<int64_t>(id) * hidden + c;
    float acc = static_cast<float>(*dst);
    for (int64_t q = first; q < n && sorted_keys[q] == id; ++q)
      acc += static_cast<float>(dout[static_cast<int64_t>(tokens[q]) * hidden + c]);
    *dst = static_cast<T>(acc);
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
                        T* dtable, cudaStream_t stream) {
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

template void embedding_forward<float>(const int32_t*, const float*, int64_t, int64_t, int64_t,
                                       float*, cudaStream_t);
template void embedding_backward<float>(const int32_t*, const float*, int64_t, int64_t, int64_t,
                                        float*, cudaStream_t);

}  // namespace switchyard::cuda
