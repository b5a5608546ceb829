#include "engine/parallel/mpi_communicator.h"

#include <climits>

#include "engine/parallel/mpi_runtime.h"

namespace switchyard {
namespace {

int to_mpi_count(int64_t n) {
  SY_CHECK_MSG(n >= 0 && n <= INT_MAX,
               "MPI collective over more than 2^31-1 elements; split the buffer");
  return static_cast<int>(n);
}

// Element types of the right width; MPI only moves these bytes, so bf16 and f16 can
// travel as 16-bit integers.
MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kBF16:
      return MPI_UINT16_T;
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
  }
  SY_CHECK_MSG(false, "unknown dtype");
}

// Counts and offsets of `size` nearly equal chunks of n elements.
void split_evenly(int64_t n, int size, std::vector<int>& counts, std::vector<int>& displs) {
  to_mpi_count(n);
  counts.resize(size);
  displs.resize(size);
  int64_t offset = 0;
  for (int i = 0; i < size; ++i) {
    counts[i] = static_cast<int>(n / size + (i < n % size ? 1 : 0));
    displs[i] = static_cast<int>(offset);
    offset += counts[i];
  }
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::duplicate(MPI_Comm comm) {
  MPI_Comm copy;
  SY_MPI_CHECK(MPI_Comm_dup(comm, &copy));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(copy));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  SY_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  SY_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  // A communicator that outlives MPI_Finalize (a static, say) has nothing left to free.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) SY_MPI_CHECK(MPI_Comm_free(&comm_));
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm part;
  SY_MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(part));
}

void MpiCommunicator::barrier() { SY_MPI_CHECK(MPI_Barrier(comm_)); }

// MPI_Allreduce and MPI_Reduce_scatter may add in any order and pick their algorithm by
// message size, so floating-point sums are made here: MPI only moves chunks
// (all-to-all), the owner of each chunk adds the contributions in rank order, and the
// sums are shared back (all-gather). Each element is summed once, by one rank, so
// every rank also ends with the same bits.
template <typename T>
void MpiCommunicator::reduce_scatter_in_rank_order(const T* in, const std::vector<int>& counts,
                                                   const std::vector<int>& displs, T* out,
                                                   MPI_Datatype type) {
  const int mine = counts[rank_];
  to_mpi_count(static_cast<int64_t>(mine) * size_);
  std::vector<T> received(static_cast<size_t>(mine) * size_);  // (size, mine)
  std::vector<int> recv_counts(size_, mine);
  std::vector<int> recv_displs(size_);
  for (int i = 0; i < size_; ++i) recv_displs[i] = i * mine;
  SY_MPI_CHECK(MPI_Alltoallv(in, counts.data(), displs.data(), type, received.data(),
                             recv_counts.data(), recv_displs.data(), type, comm_));
  for (int k = 0; k < mine; ++k) out[k] = received[k];
  for (int i = 1; i < size_; ++i) {
    const T* chunk = received.data() + static_cast<size_t>(i) * mine;
    for (int k = 0; k < mine; ++k) out[k] += chunk[k];
  }
}

template <typename T>
void MpiCommunicator::all_reduce_in_rank_order(T* values, int64_t n, MPI_Datatype type) {
  if (size_ == 1) return;
  std::vector<int> counts;
  std::vector<int> displs;
  split_evenly(n, size_, counts, displs);
  reduce_scatter_in_rank_order(values, counts, displs, values + displs[rank_], type);
  SY_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values, counts.data(),
                              displs.data(), type, comm_));
}

void MpiCommunicator::all_reduce_sum_f32(float* values, int64_t n) {
  all_reduce_in_rank_order(values, n, MPI_FLOAT);
}

void MpiCommunicator::all_reduce_sum_f64(double* values, int64_t n) {
  all_reduce_in_rank_order(values, n, MPI_DOUBLE);
}

void MpiCommunicator::all_reduce_sum_i64(int64_t* values, int64_t n) {
  // Integer addition is exact and associative, so MPI's order does not matter.
  SY_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, to_mpi_count(n), MPI_INT64_T, MPI_SUM, comm_));
}

void MpiCommunicator::reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) {
  to_mpi_count(out_n * size_);
  const int count = static_cast<int>(out_n);
  std::vector<int> counts(size_, count);
  std::vector<int> displs(size_);
  for (int i = 0; i < size_; ++i) displs[i] = i * count;
  reduce_scatter_in_rank_order(in, counts, displs, out, MPI_FLOAT);
}

void MpiCommunicator::all_gather_impl(const Tensor& in, Tensor& out) {
  const MPI_Datatype type = mpi_type(in.dtype());
  const int count = to_mpi_count(in.numel());
  to_mpi_count(out.numel());
  // MPI forbids overlapping buffers except through MPI_IN_PLACE, which covers the
  // common case of gathering shards that already sit in their place in `out`.
  const void* own_slot = static_cast<const char*>(out.raw_data()) + rank_ * in.nbytes();
  const void* send = in.raw_data() == own_slot ? MPI_IN_PLACE : in.raw_data();
  SY_MPI_CHECK(MPI_Allgather(send, count, type, out.raw_data(), count, type, comm_));
}

void MpiCommunicator::all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows,
                                        Tensor& recv, const std::vector<int64_t>& recv_rows) {
  // Counts and offsets are in rows of a contiguous row type, so only row counts (not
  // element counts) must fit in an int.
  MPI_Datatype row_type;
  SY_MPI_CHECK(
      MPI_Type_contiguous(to_mpi_count(send.row_size()), mpi_type(send.dtype()), &row_type));
  SY_MPI_CHECK(MPI_Type_commit(&row_type));
  std::vector<int> send_counts(size_), send_displs(size_), recv_counts(size_), recv_displs(size_);
  int64_t send_offset = 0;
  int64_t recv_offset = 0;
  for (int i = 0; i < size_; ++i) {
    send_counts[i] = to_mpi_count(send_rows[i]);
    send_displs[i] = to_mpi_count(send_offset);
    recv_counts[i] = to_mpi_count(recv_rows[i]);
    recv_displs[i] = to_mpi_count(recv_offset);
    send_offset += send_rows[i];
    recv_offset += recv_rows[i];
  }
  SY_MPI_CHECK(MPI_Alltoallv(send.raw_data(), send_counts.data(), send_displs.data(), row_type,
                             recv.raw_data(), recv_counts.data(), recv_displs.data(), row_type,
                             comm_));
  SY_MPI_CHECK(MPI_Type_free(&row_type));
}

std::vector<int64_t> MpiCommunicator::all_to_all_counts_impl(
    const std::vector<int64_t>& send_counts) {
  std::vector<int64_t> recv_counts(size_);
  SY_MPI_CHECK(
      MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, recv_counts.data(), 1, MPI_INT64_T, comm_));
  return recv_counts;
}

void MpiCommunicator::broadcast_impl(Tensor& tensor, int root) {
  SY_MPI_CHECK(MPI_Bcast(tensor.raw_data(), to_mpi_count(tensor.numel()), mpi_type(tensor.dtype()),
                         root, comm_));
}

void MpiCommunicator::exchange_impl(std::vector<Message>& messages) {
  std::vector<MPI_Request> requests(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    Message& m = messages[i];
    const int count = to_mpi_count(m.tensor.numel());
    const MPI_Datatype type = mpi_type(m.tensor.dtype());
    if (m.send) {
      SY_MPI_CHECK(MPI_Isend(m.tensor.raw_data(), count, type, m.peer, 0, comm_, &requests[i]));
    } else {
      SY_MPI_CHECK(MPI_Irecv(m.tensor.raw_data(), count, type, m.peer, 0, comm_, &requests[i]));
    }
  }
  SY_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                           MPI_STATUSES_IGNORE));
}

}  // namespace switchyard
