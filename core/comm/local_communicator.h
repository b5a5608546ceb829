// A group of one: every collective is a copy or nothing, so a plain
// `switchyard train` (no mpirun) runs the same code path as a multi-rank job.
#pragma once

#include <cstdint>
#include <vector>

#include "core/comm/communicator.h"

namespace switchyard {

class LocalCommunicator final : public Communicator {
 public:
  // `device`: where its tensors live (tensor_device()); the CPU for a plain run.
  explicit LocalCommunicator(Device& device = cpu_device()) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  Device& tensor_device() const override { return device_; }

 protected:
  // Never called: the public methods carry out a group of one's collectives themselves.
  void all_reduce_sum_f32(float*, int64_t) override {}
  void all_reduce_sum_f64(double*, int64_t) override {}
  void all_reduce_sum_i64(int64_t*, int64_t) override {}
  void reduce_scatter_sum_f32(const float*, float*, int64_t) override {}
  void all_gather_impl(const Tensor&, Tensor&) override {}
  void all_to_all_v_impl(const Tensor&, const std::vector<int64_t>&, Tensor&,
                         const std::vector<int64_t>&) override {}
  std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>& counts) override {
    return counts;
  }
  void broadcast_impl(Tensor&, int) override {}

 private:
  Device& device_;
};

}  // namespace switchyard
