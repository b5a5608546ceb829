// NcclCommunicator against the CPU communicator of the same ranks (MpiCommunicator under
// mpirun, LocalCommunicator alone) on the same inputs: sums bit for bit, moves exactly.
// The inputs are random fractions, so a sum taken in another order than rank order
// would differ in the last bits (from three ranks on; two add alike in either order).
//
// Runs as one process and under mpirun with one rank per GPU; a node with fewer GPUs
// than ranks skips (exit 77), as a machine without one does. One GPU checks little of
// the NCCL side: NCCL refuses two ranks of a communicator on one GPU, and a group of one
// never reaches NCCL (Communicator copies or does nothing), so it runs the creation and
// the shared stream only. The exchanges, the rank-order sum kernel, the padding of an
// uneven all-reduce and the order between communicators stay unverified until the
// two-rank run (gpu.nccl_communicator_test.np2) has two GPUs. As in tests/parallel, each
// test makes all its collective calls before checking, so a failed check on one rank
// cannot leave the others waiting.
#include "engine/parallel/nccl_communicator.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/parallel/mpi_runtime.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/parallel/rank_tests.h"

namespace switchyard {
namespace {

using testing::all_equal;
using testing::host_tensor;
using testing::poisoned;
using testing::random_integers;
using testing::random_vector;
using testing::to_device;
using testing::to_host;

std::unique_ptr<Communicator> g_cpu;
std::unique_ptr<CudaDevice> g_gpu;
std::unique_ptr<NcclCommunicator> g_nccl;

Communicator& cpu() { return *g_cpu; }
CudaDevice& gpu() { return *g_gpu; }
NcclCommunicator& nccl() { return *g_nccl; }

// What this rank contributes to a test (`salt` tells the tests apart): fractions in
// [-1, 1) for f32, integers over a wide range for i32.
template <typename T>
std::vector<T> input(int64_t n, uint64_t salt) {
  const uint64_t seed = 1000 * salt + cpu().rank();
  if constexpr (std::is_same_v<T, int32_t>) {
    return random_integers<int32_t>(n, seed, -1000000, 1000000);
  } else {
    return random_vector<T>(n, seed);
  }
}

// Bit for bit: all_equal, and the same bytes (all_equal lets -0 match +0).
::testing::AssertionResult same_bits(const Tensor& actual, const Tensor& expected) {
  ::testing::AssertionResult values = all_equal(actual, expected);
  if (!values) return values;
  const Tensor a = to_host(actual);
  if (std::memcmp(a.raw_data(), expected.raw_data(), a.nbytes()) != 0) {
    return ::testing::AssertionFailure() << "equal values with other bits (a zero's sign)";
  }
  return ::testing::AssertionSuccess();
}

int64_t sum_of(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

TEST(NcclCommunicatorTest, AllReduceSumHasTheCpuBits) {
  // Sizes that split evenly over up to 8 ranks, unevenly, into fewer elements than
  // ranks, and not at all.
  for (int64_t n : {int64_t{4096}, int64_t{1003}, int64_t{3}, int64_t{1}, int64_t{0}}) {
    Tensor expected = host_tensor({n}, input<float>(n, 1));
    Tensor actual = to_device(gpu(), expected);
    cpu().all_reduce_sum(expected);
    nccl().all_reduce_sum(actual);
    EXPECT_TRUE(same_bits(actual, expected)) << "n=" << n;
  }
}

TEST(NcclCommunicatorTest, AllReduceSumOfHostValuesHasTheCpuBits) {
  for (int64_t n : {int64_t{1001}, int64_t{2}, int64_t{0}}) {
    std::vector<double> expected = random_vector<double>(n, 1000 * 2 + cpu().rank());
    std::vector<double> actual = expected;
    std::vector<int64_t> expected_counts =
        random_integers<int64_t>(n, 1000 * 3 + cpu().rank(), -1000000, 1000000);
    // Past 32 bits, so the sum must travel as 64-bit integers.
    if (n > 0) expected_counts[0] += (int64_t{1} << 40) * (cpu().rank() + 1);
    std::vector<int64_t> actual_counts = expected_counts;
    cpu().all_reduce_sum(expected.data(), n);
    nccl().all_reduce_sum(actual.data(), n);
    cpu().all_reduce_sum(expected_counts.data(), n);
    nccl().all_reduce_sum(actual_counts.data(), n);
    EXPECT_EQ(actual, expected) << "n=" << n;
    EXPECT_EQ(actual_counts, expected_counts) << "n=" << n;
  }
}

TEST(NcclCommunicatorTest, ReduceScatterSumHasTheCpuBits) {
  const int size = cpu().size();
  const int rank = cpu().rank();
  for (int64_t chunk : {int64_t{37}, int64_t{1}, int64_t{0}}) {
    const Tensor in = host_tensor({size * chunk}, input<float>(size * chunk, 4));
    Tensor expected = Tensor::empty({chunk});
    Tensor actual = poisoned(gpu(), {chunk});
    // In place: the output is this rank's chunk of the input, as ZeRO's buckets are.
    Tensor in_place = to_device(gpu(), in);
    Tensor own_chunk = in_place.slice_rows(rank * chunk, (rank + 1) * chunk);
    cpu().reduce_scatter_sum(in, expected);
    nccl().reduce_scatter_sum(to_device(gpu(), in), actual);
    nccl().reduce_scatter_sum(in_place, own_chunk);
    EXPECT_TRUE(same_bits(actual, expected)) << "chunk=" << chunk;
    EXPECT_TRUE(same_bits(own_chunk, expected)) << "in place, chunk=" << chunk;
  }
}

template <typename T>
void check_all_gather(int64_t n, uint64_t salt) {
  const int size = cpu().size();
  const int rank = cpu().rank();
  const DType dtype = dtype_of<T>();
  const Tensor in = host_tensor({n}, input<T>(n, salt));
  Tensor expected = Tensor::empty({size * n}, dtype);
  Tensor actual = poisoned(gpu(), {size * n}, dtype);
  // In place: this rank's part already sits in its slot of the output.
  Tensor staged = to_host(poisoned(gpu(), {size * n}, dtype));
  std::memcpy(staged.slice_rows(rank * n, (rank + 1) * n).raw_data(), in.raw_data(), in.nbytes());
  Tensor in_place = to_device(gpu(), staged);
  Tensor own_slot = in_place.slice_rows(rank * n, (rank + 1) * n);
  cpu().all_gather(in, expected);
  nccl().all_gather(to_device(gpu(), in), actual);
  nccl().all_gather(own_slot, in_place);
  EXPECT_TRUE(same_bits(actual, expected)) << dtype_name(dtype) << " n=" << n;
  EXPECT_TRUE(same_bits(in_place, expected)) << "in place, " << dtype_name(dtype) << " n=" << n;
}

TEST(NcclCommunicatorTest, AllGatherMovesF32AndI32) {
  for (int64_t n : {int64_t{1001}, int64_t{1}, int64_t{0}}) {
    check_all_gather<float>(n, 5);
    check_all_gather<int32_t>(n, 6);
  }
}

template <typename T>
void check_broadcast(int64_t n, uint64_t salt) {
  for (int root = 0; root < cpu().size(); ++root) {
    Tensor expected = host_tensor({n}, input<T>(n, salt));
    Tensor actual = to_device(gpu(), expected);
    cpu().broadcast(expected, root);
    nccl().broadcast(actual, root);
    EXPECT_TRUE(same_bits(actual, expected)) << dtype_name(dtype_of<T>()) << " root=" << root;
  }
}

TEST(NcclCommunicatorTest, BroadcastMovesF32AndI32FromEveryRoot) {
  check_broadcast<float>(333, 7);
  check_broadcast<int32_t>(5, 8);
}

template <typename T>
void check_all_to_all_v(uint64_t salt) {
  const int size = cpu().size();
  const int rank = cpu().rank();
  const DType dtype = dtype_of<T>();
  const int64_t row = 3;
  // Blocks of 0 to 3 rows, a different pattern on every rank, so some are empty and the
  // rows each rank receives add up differently.
  std::vector<int64_t> send_rows(size);
  for (int j = 0; j < size; ++j) send_rows[j] = (rank + 2 * j + 1) % 4;
  const std::vector<int64_t> recv_rows = cpu().all_to_all_counts(send_rows);
  const std::vector<int64_t> nccl_recv_rows = nccl().all_to_all_counts(send_rows);
  const int64_t send_total = sum_of(send_rows);
  const int64_t recv_total = sum_of(recv_rows);
  const Tensor send = host_tensor({send_total, row}, input<T>(send_total * row, salt));
  Tensor expected = Tensor::empty({recv_total, row}, dtype);
  Tensor actual = poisoned(gpu(), {recv_total, row}, dtype);
  cpu().all_to_all_v(send, send_rows, expected, recv_rows);
  nccl().all_to_all_v(to_device(gpu(), send), send_rows, actual, recv_rows);
  EXPECT_EQ(nccl_recv_rows, recv_rows);
  EXPECT_TRUE(same_bits(actual, expected)) << dtype_name(dtype);
}

TEST(NcclCommunicatorTest, AllToAllVMovesUnevenBlocksWithEmptyOnes) {
  check_all_to_all_v<float>(9);
  check_all_to_all_v<int32_t>(10);
  // Only an exchange between ranks is timed: a group of one copies on the device.
  if (cpu().size() > 1) {
    EXPECT_GT(nccl().all_to_all_seconds(), 0.0);
  }
}

// Ops queued on the compute stream around collectives, with no synchronisation between
// them. A long stretch of work runs before the input is written, so a collective that
// did not wait for the compute stream would read the old zeros; the ops after the
// collectives would change their results early if the compute stream did not wait for
// them. As one process both collectives are copies (Communicator's group of one), so
// only a run of two ranks or more checks the NCCL side.
// Around a ring: each rank sends an f32 and an i32 message to the next rank and receives
// the previous rank's, in one exchange (a group of one has no peer).
TEST(NcclCommunicatorTest, ExchangeMovesMessagesAroundARing) {
  const int size = cpu().size();
  if (size == 1) return;
  const int next = (cpu().rank() + 1) % size;
  const int previous = (cpu().rank() + size - 1) % size;
  const Tensor f32 = host_tensor({129}, input<float>(129, 13));
  const Tensor i32 = host_tensor({7}, input<int32_t>(7, 14));
  std::vector<Communicator::Message> expected = {{true, next, f32},
                                                 {true, next, i32},
                                                 {false, previous, Tensor::empty({129}, DType::kF32)},
                                                 {false, previous, Tensor::empty({7}, DType::kI32)}};
  std::vector<Communicator::Message> actual = {{true, next, to_device(gpu(), f32)},
                                               {true, next, to_device(gpu(), i32)},
                                               {false, previous, poisoned(gpu(), {129}, DType::kF32)},
                                               {false, previous, poisoned(gpu(), {7}, DType::kI32)}};
  cpu().exchange(expected);
  nccl().exchange(actual);
  EXPECT_TRUE(same_bits(actual[2].tensor, expected[2].tensor));
  EXPECT_TRUE(same_bits(actual[3].tensor, expected[3].tensor));
}

TEST(NcclCommunicatorTest, ComputeStreamOrdersAroundCollectivesWithoutHostSyncs) {
  const int size = cpu().size();
  const int64_t n = int64_t{1} << 20;
  const std::vector<float> x = input<float>(n, 11);
  Tensor expected_sum = host_tensor({n}, x);
  Tensor expected = Tensor::empty({size * n});

  Tensor busy = to_device(gpu(), Tensor::zeros({int64_t{1} << 24}));
  const Tensor source = to_device(gpu(), expected_sum);
  Tensor values = to_device(gpu(), Tensor::zeros({n}));
  Tensor gathered = poisoned(gpu(), {size * n});
  for (int i = 0; i < 200; ++i) scale_(gpu(), busy, 0.5f);
  add_(gpu(), values, source);  // values = x
  nccl().all_reduce_sum(values);
  scale_(gpu(), values, 2.0f);
  nccl().all_gather(values, gathered);
  scale_(gpu(), gathered, 0.5f);  // powers of two: the sums come back exactly

  cpu().all_reduce_sum(expected_sum);
  cpu().all_gather(expected_sum, expected);
  EXPECT_TRUE(same_bits(gathered, expected));
}

// A process's NCCL communicators share one stream, so their collectives run in the order
// they were queued, the same on every rank (the ordering rule in nccl_communicator.h).
// Neither extra communicator makes the compute stream wait: the broadcast on `second`
// reads what the all-reduce on `first` wrote only because the shared stream orders them.
TEST(NcclCommunicatorTest, CommunicatorsOfAProcessShareOneOrderedStream) {
  const int size = cpu().size();
  std::unique_ptr<NcclCommunicator> first = NcclCommunicator::create(cpu(), gpu(), false);
  std::unique_ptr<NcclCommunicator> second = NcclCommunicator::create(cpu(), gpu(), false);
  const int64_t n = int64_t{1} << 22;
  Tensor expected = host_tensor({n}, input<float>(n, 13));
  Tensor values = to_device(gpu(), expected);
  first->all_reduce_sum(values);
  second->broadcast(values, size - 1);
  second->join_compute();
  cpu().all_reduce_sum(expected);
  cpu().broadcast(expected, size - 1);
  EXPECT_EQ(first->stream(), nccl().stream());
  EXPECT_EQ(second->stream(), nccl().stream());
  EXPECT_TRUE(same_bits(values, expected));
}

TEST(NcclCommunicatorTest, BarrierWaitsForQueuedCollectives) {
  Tensor t = to_device(gpu(), host_tensor({int64_t{1} << 20}, input<float>(int64_t{1} << 20, 12)));
  nccl().broadcast(t, cpu().size() - 1);
  nccl().barrier();
  EXPECT_EQ(cudaStreamQuery(nccl().stream()), cudaSuccess);
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  switchyard::MpiRuntime& runtime = switchyard::MpiRuntime::initialize(&argc, &argv);
  // The ranks of a node see the same GPUs, so they all skip or all run.
  const int gpus = switchyard::cuda_device_count();
  if (gpus < runtime.local_size()) {
    if (runtime.local_rank() == 0) {
      std::printf("%d CUDA devices for %d ranks on this node: skipped\n", gpus,
                  runtime.local_size());
    }
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  using switchyard::g_cpu;
  using switchyard::g_gpu;
  using switchyard::g_nccl;
  g_cpu = runtime.world_communicator();
  g_gpu = std::make_unique<switchyard::CudaDevice>(switchyard::select_local_gpu());
  g_nccl = switchyard::NcclCommunicator::create(*g_cpu, *g_gpu);
  const int status = switchyard::testing::run_tests_on_every_rank(*g_cpu);
  g_nccl.reset();
  g_gpu.reset();
  g_cpu.reset();
  return status;
}
