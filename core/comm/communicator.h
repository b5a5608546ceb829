// Collective communication over a process group, on the tensors of one device: CPU
// tensors for the host communicators (MPI, local), a GPU's for NcclCommunicator.
//
// Every member of the group must call the same collectives in the same order with
// matching sizes; a mismatch is a bug and hangs or aborts the job. Argument errors
// visible on one rank (wrong dtype, wrong sizes) are CHECK failures.
//
// Determinism: for a fixed group size every collective gives the same bits for the
// same inputs, on every rank and in every run (resume and layout-equivalence tests
// compare bits). Collectives that only move bytes are deterministic by nature; the
// floating-point sums are computed by the engine in a fixed order (see each method),
// never by MPI's or NCCL's reduction algorithms, whose summation order depends on message
// size.
#pragma once

#include <cstdint>
#include <vector>

#include "core/runtime/exact_sum.h"
#include "core/runtime/tensor.h"

namespace switchyard {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's index in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank's `tensor` (f32) becomes the element-wise sum over the group.
  // Summed in rank order 0, 1, ..., size-1 (((x0 + x1) + x2) + ...) by the rank that
  // owns each chunk, then shared, so every rank holds identical bits.
  void all_reduce_sum(Tensor& tensor);
  // The same for `n` host values (losses, token counts, norms); same summation order.
  // Integer sums are exact in any order.
  void all_reduce_sum(double* values, int64_t n);
  void all_reduce_sum(int64_t* values, int64_t n);
  // An exact sum over the group: its limbs added as integers, the same bits in any order.
  void all_reduce_sum(ExactSum& sum) { all_reduce_sum(sum.limbs(), ExactSum::kSize); }

  // `in` (f32) holds size() * out.numel() elements, read as size() equal chunks;
  // rank r's `out` gets the element-wise sum over the group of chunk r, summed in rank
  // order as all_reduce_sum does.
  void reduce_scatter_sum(const Tensor& in, Tensor& out);

  // `out` (same dtype, size() * in.numel() elements) gets every rank's `in`
  // concatenated in rank order. Any dtype.
  void all_gather(const Tensor& in, Tensor& out);

  // Row exchange for expert parallelism. `send` is row-major with sum(send_rows) rows,
  // sent as consecutive blocks: block j (send_rows[j] rows) goes to rank j. `recv`
  // (same dtype and row size, sum(recv_rows) rows) receives rank i's block for this
  // rank as its block i, in rank order. recv_rows[i] must equal what rank i sends
  // here; all_to_all_counts() gives it. Counts may be zero. Any dtype.
  void all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                    const std::vector<int64_t>& recv_rows);
  // Exchanges one count per peer: returns r with r[i] = rank i's send_counts[this rank].
  // Call it with all_to_all_v's send_rows to get its recv_rows.
  std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send_counts);

  // Every rank's `tensor` gets the bytes of rank `root`'s tensor (same dtype, numel).
  void broadcast(Tensor& tensor, int root);

  // Point-to-point messages (pipeline stages, docs/pipeline.md). A send's `tensor` goes
  // to group rank `peer`; a receive's `tensor` gets the bytes of the message from `peer`
  // (same byte count). The messages from one rank to another match in the order each
  // side posts them, so both sides must post them in the same order. Any dtype.
  struct Message {
    bool send = false;
    int peer = 0;
    Tensor tensor;
  };
  // Posts every message at once and returns when all have moved (on a device
  // communicator: once queued, as its collectives). Only the peers named take part; a
  // group of one has no peer and refuses.
  void exchange(std::vector<Message>& messages);

  // The device whose memory the tensor collectives take: the CPU for the host
  // communicators; a device communicator returns its GPU. Host data a tensor collective
  // carries goes there first (Tensor::to), which on a host communicator copies nothing.
  virtual Device& tensor_device() const { return cpu_device(); }

  // Returns once every rank of the group has called it.
  virtual void barrier() = 0;

  // Makes the device work queued after this call wait for the collectives queued before
  // it. Only a device communicator whose collectives leave the compute stream alone
  // (NcclCommunicator made with compute_waits = false) needs it; host collectives are
  // complete when they return.
  virtual void join_compute() {}

  // Wall-clock seconds this process has spent inside all_to_all_v, waiting included:
  // the cost of expert-parallel dispatch as the step sees it.
  double all_to_all_seconds() const { return all_to_all_seconds_; }

 protected:
  // The public methods check their arguments, then call these.
  virtual void all_reduce_sum_f32(float* values, int64_t n) = 0;
  virtual void all_reduce_sum_f64(double* values, int64_t n) = 0;
  virtual void all_reduce_sum_i64(int64_t* values, int64_t n) = 0;
  virtual void reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) = 0;
  virtual void all_gather_impl(const Tensor& in, Tensor& out) = 0;
  virtual void all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows,
                                 Tensor& recv, const std::vector<int64_t>& recv_rows) = 0;
  virtual std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>& send_counts) = 0;
  virtual void broadcast_impl(Tensor& tensor, int root) = 0;
  // Communicators without point-to-point messages (the local one, whose group has no
  // peer) keep this refusal.
  virtual void exchange_impl(std::vector<Message>& messages);

 private:
  // CHECKs that `tensor` is defined and lives on tensor_device() (anywhere for a group
  // of one, whose collectives the public methods carry out as copies).
  void check_tensor(const Tensor& tensor) const;

  double all_to_all_seconds_ = 0;
};

}  // namespace switchyard
