#include "engine/parallel/tensor_shards.h"

#include <cstring>

#include "core/runtime/check.h"

namespace switchyard {
namespace {

// A tensor split along `dim` reads as (outer, blocks x block_bytes): outer = the
// product of the dimensions before `dim`.
struct Blocks {
  int64_t outer = 1;
  size_t block_bytes = 0;
};

Blocks blocks_of(const Tensor& shard, int dim) {
  SY_CHECK_MSG(dim >= 0 && dim < shard.rank(), "shard dimension out of range");
  Blocks b;
  for (int d = 0; d < dim; ++d) b.outer *= shard.dim(d);
  b.block_bytes = b.outer == 0 ? 0 : shard.nbytes() / static_cast<size_t>(b.outer);
  return b;
}

}  // namespace

Tensor gather_shards(Communicator& group, const Tensor& shard, int dim) {
  const Blocks b = blocks_of(shard, dim);
  const int size = group.size();
  Shape whole_shape = shard.shape();
  whole_shape[dim] *= size;
  Tensor whole = Tensor::empty(whole_shape, shard.dtype());
  if (size == 1) {
    whole.copy_from(shard);
    return whole;
  }
  Shape stacked_shape = shard.shape();
  stacked_shape.insert(stacked_shape.begin(), size);
  // Gathered where the shards live (the group's collectives take that device's
  // tensors), then rearranged on the host.
  Tensor stacked = Tensor::empty(stacked_shape, shard.dtype(), MemoryKind::kOther, shard.device());
  group.all_gather(shard, stacked);
  const Tensor stacked_host = stacked.on_host();
  const auto* from = static_cast<const char*>(stacked_host.raw_data());
  auto* to = static_cast<char*>(whole.raw_data());
  for (int r = 0; r < size; ++r)
    for (int64_t o = 0; o < b.outer; ++o)
      std::memcpy(to + (o * size + r) * b.block_bytes,
                  from + (r * b.outer + o) * b.block_bytes, b.block_bytes);
  return whole;
}

void copy_shard(const Tensor& whole, int dim, int rank, int size, Tensor& shard) {
  const Blocks b = blocks_of(shard, dim);
  Shape expected = shard.shape();
  expected[dim] *= size;
  SY_CHECK_MSG(whole.shape() == expected && whole.dtype() == shard.dtype() && rank >= 0 &&
                   rank < size,
               "copy_shard: the whole tensor does not match the shard");
  // Cut on the host, then moved to wherever the shard lives.
  const Tensor whole_host = whole.on_host();
  Tensor shard_host = shard.on_host();
  const auto* from = static_cast<const char*>(whole_host.raw_data());
  auto* to = static_cast<char*>(shard_host.raw_data());
  for (int64_t o = 0; o < b.outer; ++o)
    std::memcpy(to + o * b.block_bytes, from + (o * size + rank) * b.block_bytes, b.block_bytes);
  if (shard_host.raw_data() != shard.raw_data()) shard.copy_from(shard_host);
}

}  // namespace switchyard
