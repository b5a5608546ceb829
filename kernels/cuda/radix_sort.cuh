// Stable key-value sort on the device (CUB radix sort), with its temporary storage taken
// from the stream-ordered pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {

// Sorts `count` pairs by the low `key_bits` bits of their keys (the others must be zero
// for the order to be by the whole key); pairs with equal keys keep their input order.
template <typename Key, typename Value>
void sort_pairs(const Key* keys_in, Key* keys_out, const Value* values_in, Value* values_out,
                int64_t count, int key_bits, cudaStream_t stream) {
  if (count == 0) return;
  size_t temp_bytes = 0;
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in,
                                                values_out, count, 0, key_bits, stream));
  // Never a null buffer: CUB would take the second call for another size query.
  Scratch<unsigned char> temp(std::max<int64_t>(1, static_cast<int64_t>(temp_bytes)), stream);
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys_in, keys_out,
                                                values_in, values_out, count, 0, key_bits, stream));
}

}  // namespace switchyard::cuda
