#include "engine/optim/grad_reducer.h"

#include <algorithm>

#include "engine/runtime/check.h"

namespace switchyard {

OverlappedGradReduce::OverlappedGradReduce(ParamStore& params,
                                           std::unique_ptr<Communicator> replicas,
                                           bool background)
    : flat_(params.dense_grads()), replicas_(std::move(replicas)) {
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
  if (background) worker_ = std::thread([this] { run_worker(); });
}

OverlappedGradReduce::~OverlappedGradReduce() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void OverlappedGradReduce::reduce(int unit) {
  const auto [begin, end] = bucket_[unit];
  if (end == begin) return;
  Tensor bucket = flat_.slice_rows(begin, end);
  replicas_->all_reduce_sum(bucket);
}

void OverlappedGradReduce::end_grads(int unit) {
  if (!reducing_) return;
  if (!worker_.joinable()) {
    reduce(unit);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(unit);
    ++in_flight_;
  }
  changed_.notify_all();
}

void OverlappedGradReduce::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return in_flight_ == 0; });
}

void OverlappedGradReduce::run_worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    const int unit = queue_.front();
    queue_.pop_front();
    lock.unlock();
    reduce(unit);
    lock.lock();
    --in_flight_;
    changed_.notify_all();
  }
}

}  // namespace switchyard
