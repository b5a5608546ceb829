#include "engine/optim/grad_reducer.h"

#include <algorithm>

#include "core/runtime/check.h"

namespace switchyard {

OverlappedGradReduce::OverlappedGradReduce(ParamStore& params,
                                           std::unique_ptr<Communicator> replicas,
                                           bool background)
    : flat_(params.dense_grads()), replicas_(std::move(replicas)), queue_(background) {
  // The flat buffer holds the resident dense gradients in registration order, and a
  // unit's parameters are registered together.
  bucket_.assign(static_cast<size_t>(std::max(params.num_units(), 1)), {0, 0});
  int64_t offset = 0;
  int last_unit = -1;
  for (const Param& p : params.params()) {
    if (p.spec.expert || !p.grad_resident) continue;
    SY_CHECK_MSG(p.unit >= last_unit, "a unit's parameters must be registered together");
    auto& [begin, end] = bucket_[p.unit];
    if (p.unit != last_unit) begin = offset;
    offset += shape_numel(p.shape);
    end = offset;
    last_unit = p.unit;
  }
  SY_CHECK_MSG(offset == flat_.numel(), "the buckets do not cover the dense gradients");
}

void OverlappedGradReduce::end_grads(int unit) {
  if (!reducing_) return;
  const auto [begin, end] = bucket_[unit];
  if (end == begin) return;
  queue_.post([this, bucket = flat_.slice_rows(begin, end)]() mutable {
    replicas_->all_reduce_sum(bucket);
  });
}

}  // namespace switchyard
