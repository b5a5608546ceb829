#include "engine/parallel/nccl_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "engine/parallel/mpi_runtime.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scratch.h"

// Checks an NCCL call; a failure prints file:line, the call and NCCL's error, then ends
// the whole job, since the other ranks would wait for this one in the next collective.
#define SY_NCCL_CHECK(call)                                                       \
  do {                                                                            \
    const ncclResult_t sy_nccl_result_ = (call);                                  \
    if (sy_nccl_result_ != ncclSuccess) {                                         \
      ::switchyard::nccl_call_failed(__FILE__, __LINE__, #call, sy_nccl_result_); \
    }                                                                             \
  } while (0)

namespace switchyard {
namespace {

[[noreturn]] void nccl_call_failed(const char* file, int line, const char* call,
                                   ncclResult_t result) {
  // The last error names the cause (a peer gone, a duplicate GPU) where the result code
  // only gives its class.
  const char* detail = ncclGetLastError(nullptr);
  const bool has_detail = detail != nullptr && detail[0] != '\0';
  std::fprintf(stderr, "switchyard: NCCL error at %s:%d: %s: %s%s%s\n", file, line, call,
               ncclGetErrorString(result), has_detail ? ": " : "", has_detail ? detail : "");
  abort_job(1);
}

template <typename T>
constexpr ncclDataType_t nccl_type();
template <>
constexpr ncclDataType_t nccl_type<float>() {
  return ncclFloat32;
}
template <>
constexpr ncclDataType_t nccl_type<double>() {
  return ncclFloat64;
}
template <>
constexpr ncclDataType_t nccl_type<int64_t>() {
  return ncclInt64;
}

// out[k] = ((pieces[0][k] + pieces[1][k]) + pieces[2][k]) + ... over `parts` rows of
// `count` elements: rank order, the additions MpiCommunicator makes. out[k] = 0 for
// count <= k < width, so the padding of an all-gather slot holds defined bytes.
template <typename T>
__global__ void sum_in_rank_order_kernel(const T* pieces, int parts, int64_t count, int64_t width,
                                         T* out) {
  for (int64_t k = cuda::grid_start(); k < width; k += cuda::grid_stride()) {
    if (k >= count) {
      out[k] = T(0);
      continue;
    }
    T sum = pieces[k];
    for (int i = 1; i < parts; ++i) sum += pieces[static_cast<int64_t>(i) * count + k];
    out[k] = sum;
  }
}

// NCCL refuses two ranks of a communicator on one GPU, with a terse error from deep
// inside ncclCommInitRank; this names the ranks and the cause first. GPUs are compared
// by UUID, so launchers that show each rank its own GPU as device 0 pass.
void refuse_shared_gpus(Communicator& cpu, const CudaDevice& device) {
  cudaDeviceProp prop;
  SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index()));
  constexpr int64_t kUuidBytes = sizeof(prop.uuid.bytes);
  Tensor own = Tensor::empty({kUuidBytes}, DType::kU8);
  std::memcpy(own.raw_data(), prop.uuid.bytes, kUuidBytes);
  Tensor every = Tensor::empty({cpu.size() * kUuidBytes}, DType::kU8);
  cpu.all_gather(own, every);
  for (int r = 0; r < cpu.size(); ++r) {
    if (r == cpu.rank() ||
        std::memcmp(every.data<uint8_t>() + r * kUuidBytes, prop.uuid.bytes, kUuidBytes) != 0) {
      continue;
    }
    std::fprintf(stderr,
                 "switchyard: rank %d: ranks %d and %d would share one GPU (%s at PCI "
                 "%04x:%02x:%02x); NCCL needs a GPU of its own for every rank, so start at "
                 "most as many ranks on a node as it has GPUs\n",
                 cpu.rank(), std::min(r, cpu.rank()), std::max(r, cpu.rank()),
                 device.name().c_str(), prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    abort_job(1);
  }
}

// The one stream of this process's NCCL communicators on `device`: made by the first of
// them, destroyed with the last. Non-blocking, so that work on the legacy default stream
// (a plain cudaMemcpy) neither waits for a collective in flight nor holds one back.
std::shared_ptr<CUstream_st> shared_collective_stream(const CudaDevice& device) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<CUstream_st>> streams;
  const std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<CUstream_st>& slot = streams[device.index()];
  if (std::shared_ptr<CUstream_st> stream = slot.lock()) return stream;
  const int index = device.index();
  SY_CUDA_CHECK(cudaSetDevice(index));
  cudaStream_t raw = nullptr;
  SY_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  std::shared_ptr<CUstream_st> stream(raw, [index](cudaStream_t s) {
    SY_CUDA_CHECK(cudaSetDevice(index));
    SY_CUDA_CHECK(cudaStreamDestroy(s));
  });
  slot = stream;
  return stream;
}

}  // namespace

int select_local_gpu() {
  const MpiRuntime& runtime = MpiRuntime::get();
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    std::fprintf(stderr, "switchyard: rank %d: no CUDA device visible; NCCL needs one per rank\n",
                 runtime.world_rank());
    abort_job(1);
  }
  return runtime.local_rank() % gpus;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& cpu, CudaDevice& device,
                                                           bool compute_waits) {
  refuse_shared_gpus(cpu, device);
  Tensor id = Tensor::empty({static_cast<int64_t>(sizeof(ncclUniqueId))}, DType::kU8);
  ncclUniqueId unique_id;
  if (cpu.rank() == 0) {
    SY_NCCL_CHECK(ncclGetUniqueId(&unique_id));
    std::memcpy(id.raw_data(), &unique_id, sizeof(unique_id));
  }
  cpu.broadcast(id, 0);
  std::memcpy(&unique_id, id.raw_data(), sizeof(unique_id));
  // Makes the device current for ncclCommInitRank, and sets up the device's memory pool
  // (CudaDevice::stream), which the collectives' scratch memory comes from.
  device.stream();
  ncclComm_t comm = nullptr;
  SY_NCCL_CHECK(ncclCommInitRank(&comm, cpu.size(), unique_id, cpu.rank()));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(cpu, device, comm, compute_waits));
}

NcclCommunicator::NcclCommunicator(Communicator& cpu, CudaDevice& device, ncclComm_t comm,
                                   bool compute_waits)
    : cpu_(cpu),
      device_(device),
      comm_(comm),
      rank_(cpu.rank()),
      size_(cpu.size()),
      compute_waits_(compute_waits),
      stream_owner_(shared_collective_stream(device)),
      stream_(stream_owner_.get()) {
  SY_CUDA_CHECK(cudaSetDevice(device_.index()));
  SY_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  SY_CUDA_CHECK(cudaEventCreateWithFlags(&collective_done_, cudaEventDisableTiming));
}

NcclCommunicator::~NcclCommunicator() {
  SY_CUDA_CHECK(cudaSetDevice(device_.index()));
  SY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Local: ncclCommDestroy may wait for the other ranks, which a rank leaving on an error
  // must not (it would never reach abort_job). Nothing is in flight after the sync.
  SY_NCCL_CHECK(ncclCommAbort(comm_));
  SY_CUDA_CHECK(cudaEventDestroy(collective_done_));
  SY_CUDA_CHECK(cudaEventDestroy(compute_ready_));
}

void NcclCommunicator::barrier() {
  SY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cpu_.barrier();
}

cudaStream_t NcclCommunicator::begin() {
  // CudaDevice::stream() also makes the device current for the calls that follow.
  cudaStream_t compute = device_.stream();
  SY_CUDA_CHECK(cudaEventRecord(compute_ready_, compute));
  SY_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  return stream_;
}

void NcclCommunicator::end() {
  if (compute_waits_) join_compute();
}

void NcclCommunicator::join_compute() {
  SY_CUDA_CHECK(cudaEventRecord(collective_done_, stream_));
  SY_CUDA_CHECK(cudaStreamWaitEvent(device_.stream(), collective_done_, 0));
}

// ncclAllReduce and ncclReduceScatter add in an order that depends on the algorithm and
// the message size, so NCCL only moves chunks here (all-to-all), each rank adds the
// pieces of its own chunk in rank order, and the sums are shared back (all-gather), as
// MpiCommunicator does.
template <typename T>
void NcclCommunicator::reduce_scatter_in_rank_order(const T* in, int64_t n, int64_t chunk, T* out,
                                                    cudaStream_t stream) {
  const auto count = [&](int r) { return std::clamp<int64_t>(n - r * chunk, 0, chunk); };
  const int64_t mine = count(rank_);
  cuda::Scratch<T> pieces(mine * size_, stream);  // (size, mine): rank i's piece is row i
  SY_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < size_; ++peer) {
    if (count(peer) > 0) {
      SY_NCCL_CHECK(ncclSend(in + peer * chunk, count(peer), nccl_type<T>(), peer, comm_, stream));
    }
    if (mine > 0) {
      SY_NCCL_CHECK(
          ncclRecv(pieces.get() + peer * mine, mine, nccl_type<T>(), peer, comm_, stream));
    }
  }
  SY_NCCL_CHECK(ncclGroupEnd());
  // Queued after the exchange on the same stream, so writing `out` inside `in` is safe.
  const unsigned int blocks = cuda::grid_blocks(chunk);
  if (blocks == 0) return;
  sum_in_rank_order_kernel<<<blocks, cuda::kThreads, 0, stream>>>(pieces.get(), size_, mine, chunk,
                                                                  out);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void NcclCommunicator::all_reduce_in_rank_order(T* values, int64_t n, cudaStream_t stream) {
  // ncclAllGather takes size() equal slots; when n does not split evenly they are padded
  // in scratch memory and the sums copied back.
  const int64_t chunk = (n + size_ - 1) / size_;
  const int64_t slots = chunk * size_;
  cuda::Scratch<T> padded(slots == n ? 0 : slots, stream);
  T* gathered = slots == n ? values : padded.get();
  T* own_slot = gathered + rank_ * chunk;
  reduce_scatter_in_rank_order(values, n, chunk, own_slot, stream);
  SY_NCCL_CHECK(ncclAllGather(own_slot, gathered, chunk, nccl_type<T>(), comm_, stream));
  if (gathered != values) {
    SY_CUDA_CHECK(
        cudaMemcpyAsync(values, gathered, n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  }
}

template <typename T>
void NcclCommunicator::all_reduce_host(T* values, int64_t n) {
  if (size_ == 1 || n == 0) return;
  // Host values wait for nothing on the compute stream, and nothing there waits for them.
  SY_CUDA_CHECK(cudaSetDevice(device_.index()));
  const size_t bytes = static_cast<size_t>(n) * sizeof(T);
  cuda::Scratch<T> buffer(n, stream_);
  SY_CUDA_CHECK(cudaMemcpyAsync(buffer.get(), values, bytes, cudaMemcpyHostToDevice, stream_));
  all_reduce_in_rank_order(buffer.get(), n, stream_);
  SY_CUDA_CHECK(cudaMemcpyAsync(values, buffer.get(), bytes, cudaMemcpyDeviceToHost, stream_));
  SY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void NcclCommunicator::all_reduce_sum_f32(float* values, int64_t n) {
  if (size_ == 1 || n == 0) return;
  cudaStream_t stream = begin();
  all_reduce_in_rank_order(values, n, stream);
  end();
}

void NcclCommunicator::all_reduce_sum_f64(double* values, int64_t n) { all_reduce_host(values, n); }

void NcclCommunicator::all_reduce_sum_i64(int64_t* values, int64_t n) {
  // Integer sums are exact in any order; the rank-ordered path serves them too.
  all_reduce_host(values, n);
}

void NcclCommunicator::reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) {
  if (out_n == 0) return;
  cudaStream_t stream = begin();
  reduce_scatter_in_rank_order(in, size_ * out_n, out_n, out, stream);
  end();
}

// The moves go as bytes, so every dtype takes the same path.
void NcclCommunicator::all_gather_impl(const Tensor& in, Tensor& out) {
  if (in.nbytes() == 0) return;
  cudaStream_t stream = begin();
  // In place when `in` is this rank's slot of `out`, which NCCL allows.
  SY_NCCL_CHECK(
      ncclAllGather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8, comm_, stream));
  end();
}

void NcclCommunicator::all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows,
                                         Tensor& recv, const std::vector<int64_t>& recv_rows) {
  SY_CHECK_MSG(send_rows[rank_] == recv_rows[rank_],
               "all_to_all_v counts disagree with the peer's");
  const size_t row_bytes = static_cast<size_t>(send.row_size()) * dtype_size(send.dtype());
  const char* send_block = static_cast<const char*>(send.raw_data());
  char* recv_block = static_cast<char*>(recv.raw_data());
  cudaStream_t stream = begin();
  SY_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < size_; ++peer) {
    const size_t send_bytes = static_cast<size_t>(send_rows[peer]) * row_bytes;
    const size_t recv_bytes = static_cast<size_t>(recv_rows[peer]) * row_bytes;
    if (send_bytes > 0) {
      SY_NCCL_CHECK(ncclSend(send_block, send_bytes, ncclUint8, peer, comm_, stream));
    }
    if (recv_bytes > 0) {
      SY_NCCL_CHECK(ncclRecv(recv_block, recv_bytes, ncclUint8, peer, comm_, stream));
    }
    send_block += send_bytes;
    recv_block += recv_bytes;
  }
  SY_NCCL_CHECK(ncclGroupEnd());
  end();
}

std::vector<int64_t> NcclCommunicator::all_to_all_counts_impl(
    const std::vector<int64_t>& send_counts) {
  // Host counts for host-side planning: the CPU group carries them without a device trip.
  return cpu_.all_to_all_counts(send_counts);
}

void NcclCommunicator::exchange_impl(std::vector<Message>& messages) {
  cudaStream_t stream = begin();
  SY_NCCL_CHECK(ncclGroupStart());
  for (Message& m : messages) {
    const size_t bytes = m.tensor.nbytes();
    if (bytes == 0) continue;
    if (m.send) {
      SY_NCCL_CHECK(ncclSend(m.tensor.raw_data(), bytes, ncclUint8, m.peer, comm_, stream));
    } else {
      SY_NCCL_CHECK(ncclRecv(m.tensor.raw_data(), bytes, ncclUint8, m.peer, comm_, stream));
    }
  }
  SY_NCCL_CHECK(ncclGroupEnd());
  end();
}

void NcclCommunicator::broadcast_impl(Tensor& tensor, int root) {
  if (tensor.nbytes() == 0) return;
  cudaStream_t stream = begin();
  SY_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), tensor.nbytes(), ncclUint8,
                              root, comm_, stream));
  end();
}

void use_nccl(ProcessGroups& groups, CudaDevice& device) {
  // Any two ranks on one GPU, whether or not they share a group.
  refuse_shared_gpus(*groups.world, device);
  // The same groups in the same order on every rank, so each creation meets its peers.
  auto replace = [&](std::unique_ptr<Communicator>& group, bool compute_waits) {
    if (group->size() == 1) return;
    std::unique_ptr<Communicator> nccl = NcclCommunicator::create(*group, device, compute_waits);
    groups.hosts.push_back(std::move(group));
    group = std::move(nccl);
  };
  replace(groups.tp, true);
  replace(groups.dp, true);
  replace(groups.ep, true);
  replace(groups.expert_dp, true);
  replace(groups.dp_background, false);
  // Stage-to-stage messages: a pass reads what the exchange before it received.
  replace(groups.pipeline, true);
  groups.background_collectives = false;
}

}  // namespace switchyard
