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

// Pieces: the sorted positions cut at every multiple of kPiece (kernels/cpu/embedding.h's
// kEmbeddingPiece), each run of one id within a block of kPiece positions summed from zero
// in token order. Phase one: one thread per (block, column) sums its block's pieces. A
// run wholly inside the block is added to its row at once (no other thread touches that
// row); the piece of a run that began in an earlier block goes to head[block], and the
// piece of a run that goes on past the block to tail[block].
constexpr int64_t kPiece = 32;

template <typename T>
__global__ void embedding_pieces_kernel(const uint32_t* sorted_keys, const int32_t* tokens,
                                        const T* dout, int64_t n, int64_t vocab, int64_t hidden,
                                        float* dtable, float* head, float* tail) {
  const int64_t blocks = (n + kPiece - 1) / kPiece;
  for (int64_t p = grid_start(); p < blocks * hidden; p += grid_stride()) {
    const int64_t block = p / hidden, c = p % hidden;
    const int64_t end = (block + 1) * kPiece < n ? (block + 1) * kPiece : n;
    for (int64_t q = block * kPiece; q < end;) {
      const uint32_t id = sorted_keys[q];
      if (id == vocab) break;  // the skipped tokens sort last
      const bool starts_here = q == 0 || sorted_keys[q - 1] != id;
      float sum = 0.0f;
      for (; q < end && sorted_keys[q] == id; ++q)
        sum += static_cast<float>(dout[static_cast<int64_t>(tokens[q]) * hidden + c]);
      const bool ends_here = q == n || sorted_keys[q] != id;
      if (!starts_here)
        head[block * hidden + c] = sum;
      else if (!ends_here)
        tail[block * hidden + c] = sum;
      else
        dtable[static_cast<int64_t>(id) * hidden + c] += sum;
    }
  }
}

// Phase two: one thread per (sorted position, column); at the start of a run that goes on
// past its block, the thread adds the run's pieces to the row in order: its first block's
// tail, then the head of every later block the run reaches.
__global__ void embedding_runs_kernel(const uint32_t* sorted_keys, int64_t n, int64_t vocab,
                                      int64_t hidden, const float* head, const float* tail,
                                      float* dtable) {
  for (int64_t p = grid_start(); p < n * hidden; p += grid_stride()) {
    const int64_t first = p / hidden;
    const uint32_t id = sorted_keys[first];
    if (id == vocab || (first > 0 && sorted_keys[first - 1] == id)) continue;
    const int64_t block = first / kPiece;
    int64_t next = (block + 1) * kPiece;                 // the start of the next block
    if (next >= n || sorted_keys[next] != id) continue;  // wholly in its block: phase one
    const int64_t c = p % hidden;
    float* dst = dtable + static_cast<int64_t>(id) * hidden + c;
    float acc = *dst + tail[block * hidden + c];
    for (; next < n && sorted_keys[next] == id; next += kPiece)
      acc += head[next / kPiece * hidden + c];
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
  const int64_t blocks = (n + kPiece - 1) / kPiece;
  Scratch<float> head(blocks * hidden, stream), tail(blocks * hidden, stream);
  embedding_pieces_kernel<<<grid_blocks(blocks * hidden), kThreads, 0, stream>>>(
      sorted_keys.get(), sorted_tokens.get(), dout, n, vocab, hidden, dtable, head.get(),
      tail.get());
  SY_CUDA_CHECK_LAUNCH();
  embedding_runs_kernel<<<grid_blocks(n * hidden), kThreads, 0, stream>>>(
      sorted_keys.get(), n, vocab, hidden, head.get(), tail.get(), dtable);
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
