// CUDA token embedding lookup and its gradient (twins of kernels/cpu/embedding.h). Id -1
// (a row another vocabulary-parallel rank holds) gives a zero row and no gradient. Ids are
// checked on the device: one outside [-1, vocab) stops the kernel, and the next checked
// CUDA call aborts. Templates on the element type of the table and the activations,
// instantiated for float and __nv_bfloat16; the table gradient is float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// ids: (n), table: (vocab, hidden) -> out: (n, hidden), rows copied as they are.
template <typename T>
void embedding_forward(const int32_t* ids, const T* table, int64_t n, int64_t vocab, int64_t hidden,
                       T* out, cudaStream_t stream);
// dtable: (vocab, hidden) += dout rows scattered by ids. The tokens are sorted by id
// (stable); each id's tokens are summed (loaded as float) in pieces of at most 32 sorted
// positions in parallel, and the pieces added to the row in order: exactly the additions
// the CPU kernel makes, deterministic, without atomics, and with no serial chain longer
// than a piece plus one addition per piece of an id's run.
template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, int64_t n, int64_t vocab, int64_t hidden,
                        float* dtable, cudaStream_t stream);

}  // namespace switchyard::cuda
