#include "core/runtime/work_queue.h"

#include <utility>

namespace switchyard {

WorkQueue::WorkQueue(bool background) {
  if (background) thread_ = std::thread([this] { run(); });
}

WorkQueue::~WorkQueue() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void WorkQueue::post(std::function<void()> work) {
  if (!thread_.joinable()) {
    work();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    ++unfinished_;
  }
  changed_.notify_all();
}

void WorkQueue::wait_until_at_most(int pending) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this, pending] { return unfinished_ <= pending; });
}

void WorkQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything has run
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work();
    lock.lock();
    --unfinished_;
    changed_.notify_all();
  }
}

}  // namespace switchyard
