// Every collective against a reference computed locally from every rank's (seeded)
// input. Integer-valued floats make the sums exact, so results must match bit for bit.
// Run as one process (LocalCommunicator) and under mpirun with 2 and 4 ranks. Each
// test makes all its collective calls before checking, so a failed check on one rank
// cannot leave the others waiting.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/parallel/parallel_test_env.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::host_tensor;
using testing::random_integers;
using testing::random_vector;
using testing::values_of;
using testing::world;

// What rank `rank` contributes to a test: integers in [-50, 50] as floats.
std::vector<float> integer_input(int64_t n, int rank, uint64_t salt) {
  return random_integers<float>(n, 1000 * salt + rank, -50, 50);
}

bool any_non_zero(const std::vector<float>& v) {
  for (float x : v) {
    if (x != 0.0f) return true;
  }
  return false;
}

TEST(CommunicatorTest, AllReduceSumMatchesReference) {
  const int size = world().size();
  // Sizes that split evenly, unevenly, into fewer elements than ranks, and not at all.
  for (int64_t n : {int64_t{4096}, int64_t{1003}, int64_t{3}, int64_t{1}, int64_t{0}}) {
    Tensor t = host_tensor({n}, integer_input(n, world().rank(), 1));
    world().all_reduce_sum(t);
    std::vector<float> expected(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < size; ++r) {
      std::vector<float> x = integer_input(n, r, 1);
      for (int64_t i = 0; i < n; ++i) expected[i] += x[i];
    }
    EXPECT_EQ(values_of<float>(t), expected) << "n=" << n;
    if (n > 16) {
      EXPECT_TRUE(any_non_zero(expected));
    }
  }
}

TEST(CommunicatorTest, AllReduceSumHostArrays) {
  const int size = world().size();
  const int rank = world().rank();
  std::vector<double> doubles = {0.5 * rank, 1.0, -2.0 * rank - 1.0};
  std::vector<int64_t> counts = {rank, 1, int64_t{1} << 40, -7 * rank};
  world().all_reduce_sum(doubles.data(), static_cast<int64_t>(doubles.size()));
  world().all_reduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  const int64_t rank_sum = static_cast<int64_t>(size) * (size - 1) / 2;
  EXPECT_EQ(doubles, (std::vector<double>{0.5 * rank_sum, 1.0 * size, -2.0 * rank_sum - size}));
  EXPECT_EQ(counts,
            (std::vector<int64_t>{rank_sum, size, size * (int64_t{1} << 40), -7 * rank_sum}));
}

TEST(CommunicatorTest, ReduceScatterSumGivesEachRankItsChunk) {
  const int size = world().size();
  const int rank = world().rank();
  const int64_t chunk = 37;
  Tensor in = host_tensor({size * chunk}, integer_input(size * chunk, rank, 2));
  Tensor out = Tensor::empty({chunk});
  world().reduce_scatter_sum(in, out);
  std::vector<float> expected(chunk, 0.0f);
  for (int r = 0; r < size; ++r) {
    std::vector<float> x = integer_input(size * chunk, r, 2);
    for (int64_t i = 0; i < chunk; ++i) expected[i] += x[rank * chunk + i];
  }
  EXPECT_EQ(values_of<float>(out), expected);
  EXPECT_TRUE(any_non_zero(expected));
}

TEST(CommunicatorTest, AllGatherConcatenatesInRankOrder) {
  const int size = world().size();
  const int rank = world().rank();
  const int64_t n = 5;
  Tensor in = host_tensor({n}, integer_input(n, rank, 3));
  Tensor out = Tensor::empty({size, n});
  world().all_gather(in, out);
  // Shards already in their place in the output (ZeRO-3 style) take MPI_IN_PLACE.
  std::vector<int64_t> in_place_values(static_cast<size_t>(size * 2), -1);
  in_place_values[2 * rank] = 10 * rank;
  in_place_values[2 * rank + 1] = 10 * rank + 1;
  Tensor in_place = host_tensor({size, 2}, in_place_values);
  Tensor own_row = in_place.slice_rows(rank, rank + 1);
  world().all_gather(own_row, in_place);

  std::vector<float> expected;
  std::vector<int64_t> expected_in_place;
  for (int r = 0; r < size; ++r) {
    std::vector<float> x = integer_input(n, r, 3);
    expected.insert(expected.end(), x.begin(), x.end());
    expected_in_place.push_back(10 * r);
    expected_in_place.push_back(10 * r + 1);
  }
  EXPECT_EQ(values_of<float>(out), expected);
  EXPECT_EQ(values_of<int64_t>(in_place), expected_in_place);
}

TEST(CommunicatorTest, AllGatherMovesBf16Bits) {
  const int size = world().size();
  const int rank = world().rank();
  Tensor in = Tensor::empty({3}, DType::kBF16);
  const uint16_t bits[3] = {static_cast<uint16_t>(0x3f80 + rank), 0x7fc0, 0x8001};
  std::memcpy(in.raw_data(), bits, sizeof(bits));
  Tensor out = Tensor::empty({size * 3}, DType::kBF16);
  world().all_gather(in, out);
  const uint16_t* got = static_cast<const uint16_t*>(out.raw_data());
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(got[3 * r], 0x3f80 + r);
    EXPECT_EQ(got[3 * r + 1], 0x7fc0);
    EXPECT_EQ(got[3 * r + 2], 0x8001);
  }
}

// Rows rank `from` sends to rank `to`: uneven, and zero for some pairs.
int64_t rows_between(int from, int to) { return (from + 2 * to) % 3; }

// Element `col` of row `row` of the block `from` sends to `to`: unique per position.
float element(int from, int to, int64_t row, int64_t col) {
  return static_cast<float>(1000 * from + 100 * to + 10 * row + col + 1);
}

TEST(CommunicatorTest, AllToAllVWithUnevenAndZeroCounts) {
  const int size = world().size();
  const int rank = world().rank();
  const int64_t width = 4;
  std::vector<int64_t> send_rows(size);
  std::vector<float> send_values;
  for (int to = 0; to < size; ++to) {
    send_rows[to] = rows_between(rank, to);
    for (int64_t row = 0; row < send_rows[to]; ++row) {
      for (int64_t col = 0; col < width; ++col) send_values.push_back(element(rank, to, row, col));
    }
  }
  int64_t total_send = 0;
  for (int64_t rows : send_rows) total_send += rows;
  Tensor send = host_tensor({total_send, width}, send_values);

  const std::vector<int64_t> recv_rows = world().all_to_all_counts(send_rows);
  int64_t total_recv = 0;
  for (int64_t rows : recv_rows) total_recv += rows;
  Tensor recv = Tensor::empty({total_recv, width});
  world().all_to_all_v(send, send_rows, recv, recv_rows);

  std::vector<int64_t> expected_rows(size);
  std::vector<float> expected;
  for (int from = 0; from < size; ++from) {
    expected_rows[from] = rows_between(from, rank);
    for (int64_t row = 0; row < expected_rows[from]; ++row) {
      for (int64_t col = 0; col < width; ++col) expected.push_back(element(from, rank, row, col));
    }
  }
  EXPECT_EQ(recv_rows, expected_rows);
  EXPECT_EQ(values_of<float>(recv), expected);
}

TEST(CommunicatorTest, AllToAllVWithNothingToSend) {
  const int size = world().size();
  const std::vector<int64_t> zeros(size, 0);
  Tensor send = Tensor::empty({0, 8}, DType::kI32);
  Tensor recv = Tensor::empty({0, 8}, DType::kI32);
  const std::vector<int64_t> recv_rows = world().all_to_all_counts(zeros);
  world().all_to_all_v(send, zeros, recv, recv_rows);
  EXPECT_EQ(recv_rows, zeros);
}

TEST(CommunicatorTest, BroadcastFromEveryRoot) {
  const int size = world().size();
  const int rank = world().rank();
  std::vector<std::vector<float>> got;
  for (int root = 0; root < size; ++root) {
    Tensor t = host_tensor({17}, integer_input(17, rank, 4 + root));
    world().broadcast(t, root);
    got.push_back(values_of<float>(t));
  }
  world().barrier();
  for (int root = 0; root < size; ++root) {
    EXPECT_EQ(got[root], integer_input(17, root, 4 + root)) << "root " << root;
  }
}

// Sums of arbitrary floats depend on the order of addition. all_reduce_sum promises
// rank order ((x0 + x1) + x2) + ..., identical bits on every rank, and the same bits on
// every call.
TEST(CommunicatorTest, AllReduceSumIsDeterministic) {
  const int size = world().size();
  const int rank = world().rank();
  const int64_t n = 100003;
  const std::vector<float> mine = random_vector<float>(n, 7000 + rank, -1e3, 1e3);
  Tensor first = host_tensor({n}, mine);
  Tensor second = host_tensor({n}, mine);
  world().all_reduce_sum(first);
  world().all_reduce_sum(second);
  Tensor everyones = Tensor::empty({size, n});
  world().all_gather(first, everyones);

  std::vector<float> rank_order = random_vector<float>(n, 7000, -1e3, 1e3);
  for (int r = 1; r < size; ++r) {
    const std::vector<float> x = random_vector<float>(n, 7000 + r, -1e3, 1e3);
    for (int64_t i = 0; i < n; ++i) rank_order[i] += x[i];
  }
  EXPECT_EQ(std::memcmp(first.raw_data(), second.raw_data(), first.nbytes()), 0);
  EXPECT_EQ(std::memcmp(first.raw_data(), rank_order.data(), first.nbytes()), 0);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(
        std::memcmp(everyones.slice_rows(r, r + 1).raw_data(), first.raw_data(), first.nbytes()), 0)
        << "rank " << r << " holds other bits";
  }
}

}  // namespace
}  // namespace switchyard
