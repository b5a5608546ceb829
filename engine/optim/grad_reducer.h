// Data-parallel gradient reduction in buckets, overlapped with backward.
//
// One bucket per unit (layer; see ParamHooks): the unit's dense gradients, a contiguous
// range of the ParamStore's flat dense gradient buffer. On the step's last micro-batch,
// as soon as backward finishes a unit, its bucket is all-reduced over the data-parallel
// group, on a background thread with a communicator of its own where MPI allows threads
// to communicate (else at once, on the calling thread), while backward goes on through
// the layers before it. Each element is summed in rank order as by one all-reduce over
// the whole buffer, so the gradients are the same bits either way.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/param_store.h"
#include "core/runtime/work_queue.h"

namespace switchyard {

class OverlappedGradReduce final : public ParamHooks {
 public:
  // `replicas`: a communicator over the data-parallel group used by nothing else.
  // `background`: reduce on a thread of its own. Construct after params.allocate().
  OverlappedGradReduce(ParamStore& params, std::unique_ptr<Communicator> replicas,
                       bool background);

  // Whether the coming backward pass is the step's last micro-batch, which reduces.
  void set_reducing(bool reducing) { reducing_ = reducing; }
  // Returns once every bucket of the last backward pass is reduced, or, on a device
  // communicator, once their reductions are queued ahead of the device work that follows.
  void wait() {
    queue_.wait();
    replicas_->join_compute();
  }

  void acquire(int) override {}
  void release(int) override {}
  void begin_grads(int) override {}
  void end_grads(int unit) override;

 private:
  Tensor flat_;                                      // the dense gradients
  std::vector<std::pair<int64_t, int64_t>> bucket_;  // per unit: [begin, end) of flat_
  std::unique_ptr<Communicator> replicas_;
  bool reducing_ = false;
  WorkQueue queue_;  // last: its thread ends before the members its work uses
};

}  // namespace switchyard
