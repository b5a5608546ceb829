// Communicator over NCCL, for CUDA tensors on one GPU per rank. Only built with the CUDA
// backend (SWITCHYARD_CUDA=ON, which defines SWITCHYARD_WITH_NCCL).
//
// Streams: the NCCL communicators of a process on one GPU share one non-blocking stream,
// beside the device's compute stream (CudaDevice::stream()), so communication can
// overlap compute. Each collective first makes that stream wait for the work queued so
// far on the compute stream, and the compute stream then waits for the collective: ops
// queued on the compute stream before a collective feed it and ops queued after see its
// result, with no host synchronisation. Tensor collectives return once queued, as ops
// do.
//
// The ordering rule: the collectives of all of a process's communicators run one after
// another, in the order the process queued them. Every rank queues its collectives in
// the same order (the trainer's calls do not depend on the rank), so every GPU runs
// them in that order too. On a stream of their own, two communicators' collectives
// (the expert all-to-all and a background gradient reduction) could start in one order
// on one GPU and in the other on its peer, each kernel waiting for a peer that waits
// for the other, which NCCL warns deadlocks.
//
// Determinism as communicator.h promises: NCCL only moves bytes. reduce_scatter_sum is
// an all-to-all of chunks (grouped ncclSend/ncclRecv) and a kernel adding each chunk's
// pieces in rank order; all_reduce_sum adds an all-gather of the sums (ncclAllGather).
// That is as many bytes on the wire as NCCL's ring algorithms, and the same additions,
// hence bits, as MpiCommunicator.
//
// all_to_all_seconds() counts the time to queue the exchange, not the transfer, which
// runs on the GPU after all_to_all_v returns.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"
#include "engine/parallel/topology.h"
#include "kernels/cuda/cuda_device.h"

namespace switchyard {

// The GPU this process should use, one per rank: its node-local rank
// (MpiRuntime::local_rank(), so MpiRuntime::initialize must have run) modulo the GPUs it
// sees, which also fits launchers that show each rank its own GPU alone. Ends the job
// with a message when no GPU is visible; ranks left sharing a GPU (more ranks on a node
// than GPUs) are refused by NcclCommunicator::create.
int select_local_gpu();

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `cpu` (an MpiCommunicator, or a LocalCommunicator for a world of
  // one): a communicator over the same ranks, in the same order, on `device`. Rank 0
  // makes NCCL's unique id and broadcasts it over `cpu`. Every rank must bring a
  // different GPU; when two share one, the job ends with a message naming them. `cpu`
  // and `device` must outlive the communicator; all_to_all_counts and barrier run over
  // `cpu`. With `compute_waits` false the compute stream does not wait for the tensor
  // collectives (see the top of this file) until join_compute(): for gradient buckets
  // reduced while backward goes on, which nothing reads before the optimizer.
  static std::unique_ptr<NcclCommunicator> create(Communicator& cpu, CudaDevice& device,
                                                  bool compute_waits = true);

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  // Waits for the queued collectives, then frees the communicator on this rank alone
  // (ncclCommAbort), so a rank that leaves on an error does not wait for the others.
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Waits for the collectives queued so far, then for every rank (over `cpu`).
  void barrier() override;
  void join_compute() override;
  Device& tensor_device() const override { return device_; }

  CudaDevice& device() const { return device_; }
  // The stream the collectives run on: the same for every NCCL communicator of this
  // process on this GPU.
  cudaStream_t stream() const { return stream_; }

 protected:
  void all_reduce_sum_f32(float* values, int64_t n) override;
  // The host-value sums stay on the host: their values travel to the GPU and back, and
  // they return once the result is there.
  void all_reduce_sum_f64(double* values, int64_t n) override;
  void all_reduce_sum_i64(int64_t* values, int64_t n) override;
  void reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) override;
  void all_gather_impl(const Tensor& in, Tensor& out) override;
  void all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                         const std::vector<int64_t>& recv_rows) override;
  std::vector<int64_t> all_to_all_counts_impl(const std::vector<int64_t>& send_counts) override;
  void broadcast_impl(Tensor& tensor, int root) override;
  // One NCCL group of ncclSend and ncclRecv calls, in the order given.
  void exchange_impl(std::vector<Message>& messages) override;

 private:
  // Takes ownership of `comm`.
  NcclCommunicator(Communicator& cpu, CudaDevice& device, ncclComm_t comm, bool compute_waits);

  // Makes stream_ wait for the work queued on the compute stream and returns it.
  cudaStream_t begin();
  // Makes the compute stream wait for the work queued on stream_, unless compute_waits_
  // is false.
  void end();

  // Rank r gets, in `out`, the rank-ordered sum over every rank's `in` (n elements) of
  // chunk r: elements [r chunk, min((r + 1) chunk, n)), count(r) of them; out[k] = 0
  // for count(r) <= k < chunk. `out` (chunk elements) may lie inside `in`.
  template <typename T>
  void reduce_scatter_in_rank_order(const T* in, int64_t n, int64_t chunk, T* out,
                                    cudaStream_t stream);
  // In place, on `stream`: `values` (n elements on the GPU) becomes the rank-ordered
  // sum over the group.
  template <typename T>
  void all_reduce_in_rank_order(T* values, int64_t n, cudaStream_t stream);
  // The same for host values, through a device buffer; returns once they are back.
  template <typename T>
  void all_reduce_host(T* values, int64_t n);

  Communicator& cpu_;
  CudaDevice& device_;
  ncclComm_t comm_;
  int rank_ = 0;
  int size_ = 1;
  bool compute_waits_ = true;
  std::shared_ptr<CUstream_st> stream_owner_;
  cudaStream_t stream_ = nullptr;
  // Recorded on the compute stream before a collective, and on stream_ after it.
  cudaEvent_t compute_ready_ = nullptr;
  cudaEvent_t collective_done_ = nullptr;
};

// Replaces each group of `groups` larger than one rank, world aside, with an
// NcclCommunicator on `device` made over it (collective: every rank calls it, after
// make_process_groups); the host communicators move to groups.hosts. The world group
// stays a host one (barriers, checkpoints); the pipeline group's stage-to-stage
// messages (exchange) go over NCCL like the other groups' collectives. The compute
// stream does not wait for dp_background's collectives: they reduce gradients while
// backward goes on, and their users join them (OverlappedGradReduce::wait, ZeroShards).
// background_collectives turns off: NCCL calls only queue work, so its stream gives the
// overlap that the background thread gives MPI. Ranks that would share a GPU are refused.
void use_nccl(ProcessGroups& groups, CudaDevice& device);

}  // namespace switchyard
