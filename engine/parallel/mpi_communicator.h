// Communicator over an MPI communicator (OpenMPI), for CPU tensors. Every MPI call is
// checked; a failure aborts the whole job with MPI's error string.
//
// One call moves at most 2^31-1 elements (MPI counts are int): larger buffers are a
// CHECK failure, so callers bucket big gradient or parameter buffers.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"

namespace switchyard {

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over the same processes as `comm` with its own message space, so
  // its collectives never match another communicator's.
  static std::unique_ptr<MpiCommunicator> duplicate(MPI_Comm comm);

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override;

  // Collective over this group (MPI_Comm_split): the ranks passing the same `color`
  // form a new group, ordered by `key`.
  std::unique_ptr<MpiCommunicator> split(int color, int key) const;

  MPI_Comm comm() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;

 protected:
  void all_reduce_sum_f32(float* values, int64_t n) override;
  void all_reduce_sum_f64(double* values, int64_t n) override;
  void all_reduce_sum_i64(int64_t* values, int64_t n) override;
  void reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) override;
  void all_gather_impl(const Tensor& in, Tensor& out) override;
  void all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                         const std::vector<int64_t>& recv_rows) override;
  std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>& send_counts) override;
  void broadcast_impl(Tensor& tensor, int root) override;
  // MPI_Isend and MPI_Irecv of every message (one tag: MPI matches them in order), then
  // MPI_Waitall.
  void exchange_impl(std::vector<Message>& messages) override;

 private:
  // Takes ownership of `comm`.
  explicit MpiCommunicator(MPI_Comm comm);

  // Sum of `values` over the group with the fixed order described in communicator.h.
  template <typename T>
  void all_reduce_in_rank_order(T* values, int64_t n, MPI_Datatype type);
  // Rank r gets the rank-ordered sum of chunk r (counts[r] elements at displs[r]) of
  // every rank's `in`, written to `out`; `out` may lie inside `in`.
  template <typename T>
  void reduce_scatter_in_rank_order(const T* in, const std::vector<int>& counts,
                                    const std::vector<int>& displs, T* out, MPI_Datatype type);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace switchyard
