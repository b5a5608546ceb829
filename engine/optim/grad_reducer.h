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

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/parallel/communicator.h"
#include "engine/runtime/param_store.h"

namespace switchyard {

class OverlappedGradReduce final : public ParamHooks {
 public:
  // `replicas`: a communicator over the data-parallel group used by nothing else.
  // `background`: reduce on a thread of its own. Construct after params.allocate().
  OverlappedGradReduce(ParamStore& params, std::unique_ptr<Communicator> replicas,
                       bool background);
  ~OverlappedGradReduce() override;
  OverlappedGradReduce(const OverlappedGradReduce&) = delete;
  OverlappedGradReduce& operator=(const OverlappedGradReduce&) = delete;

  // Whether the coming backward pass is the step's last micro-batch, which reduces.
  void set_reducing(bool reducing) { reducing_ = reducing; }
  // Returns once every bucket of the last backward pass is reduced.
  void wait();

  void acquire(int) override {}
  void release(int) override {}
  void begin_grads(int) override {}
  void end_grads(int unit) override;

 private:
  void reduce(int unit);
  void run_worker();

  Tensor flat_;                                      // the dense gradients
  std::vector<std::pair<int64_t, int64_t>> bucket_;  // per unit: [begin, end) of flat_
  std::unique_ptr<Communicator> replicas_;
  bool reducing_ = false;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<int> queue_;  // units posted and not yet reduced, in order
  int in_flight_ = 0;      // posted and not yet finished
  bool stopping_ = false;
  std::thread worker_;     // not started without `background`
};

}  // namespace switchyard
