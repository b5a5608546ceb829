// A group of one: every collective is a copy or nothing, so a plain
// `switchyard train` (no mpirun) runs the same code path as a multi-rank job.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/parallel/communicator.h"

namespace switchyard {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}

 protected:
  void all_reduce_sum_f32(float* values, int64_t n) override {}
  void all_reduce_sum_f64(double* values, int64_t n) override {}
  void all_reduce_sum_i64(int64_t* values, int64_t n) override {}
  void reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) override;
  void all_gather_impl(const Tensor& in, Tensor& out) override;
  void all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                         const std::vector<int64_t>& recv_rows) override;
  std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>& send_counts) override {
    return send_counts;
  }
  void broadcast_impl(Tensor& tensor, int root) override {}
};

}  // namespace switchyard
