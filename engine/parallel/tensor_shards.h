// Whole tensors from the shards a group holds along one dimension, and back: how
// tensor-parallel parameters are saved whole (checkpoints, final weights) and loaded
// into any tensor-parallel size.
#pragma once

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// Collective over `group`: every rank passes its shard (on the device the group's
// collectives take), the group's rank r holding block r of dimension `dim`; returns the
// whole tensor (same dtype, on the host).
Tensor gather_shards(Communicator& group, const Tensor& shard, int dim);

// Copies block `rank` of `size` equal blocks of dimension `dim` of `whole` into `shard`
// (each on any device).
void copy_shard(const Tensor& whole, int dim, int rank, int size, Tensor& shard);

}  // namespace switchyard
