// Work run in order on a thread of its own, beside the caller: how gradient reductions
// overlap with backward. Without `background` the work runs at once on the caller.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace switchyard {

class WorkQueue {
 public:
  explicit WorkQueue(bool background);
  // Finishes the posted work, then ends the thread.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Runs `work` after everything posted before it.
  void post(std::function<void()> work);
  // Returns once everything posted so far has run.
  void wait() { wait_until_at_most(0); }
  // Returns once at most `pending` posted pieces of work have not yet finished (bounds
  // the memory that work in flight holds).
  void wait_until_at_most(int pending);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  int unfinished_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // not started without `background`
};

}  // namespace switchyard
