// The loader: every window once per epoch, disjoint and complete rank slices of each
// global batch, exact resume from a saved state, errors from damaged data.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;

constexpr int64_t kSeq = 16;

// Token i has id i, so window w's ids are w * kSeq .. w * kSeq + kSeq - 1.
class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 3 shards, so windows cross shard boundaries; W = (1001 - 1) / 16 = 62 windows.
    testing::write_position_dataset(dir_.path().string(), {400, 333, 268}, {200});
    dataset_ = std::make_unique<TokenDataset>(*TokenDataset::open(dir_.path().string(), "train"));
  }

  std::unique_ptr<Loader> make(int64_t global_batch, int rank, int size, uint64_t seed = 7) {
    LoaderOptions o;
    o.seq_len = kSeq;
    o.seed = seed;
    o.global_batch = global_batch;
    o.dp_rank = rank;
    o.dp_size = size;
    auto loader = Loader::create(*dataset_, o);
    EXPECT_TRUE(loader.ok()) << loader.status();
    return std::move(*loader);
  }

  // The next `count` windows of a loader, identified by their first id; checks that
  // each window's ids and targets are the consecutive tokens it claims.
  static std::vector<int64_t> take(Loader& loader, int64_t count, int64_t micro = 1) {
    std::vector<int64_t> windows;
    std::vector<int32_t> ids(micro * kSeq), targets(micro * kSeq);
    for (int64_t done = 0; done < count; done += micro) {
      EXPECT_TRUE(loader.next_batch(micro, ids.data(), targets.data()).ok());
      for (int64_t m = 0; m < micro; ++m) {
        const int32_t first = ids[m * kSeq];
        EXPECT_EQ(first % kSeq, 0);
        for (int64_t j = 0; j < kSeq; ++j) {
          EXPECT_EQ(ids[m * kSeq + j], first + j);
          EXPECT_EQ(targets[m * kSeq + j], first + j + 1);
        }
        windows.push_back(first / kSeq);
      }
    }
    return windows;
  }

  ScratchDir dir_;
  std::unique_ptr<TokenDataset> dataset_;
};

TEST_F(LoaderTest, EveryWindowOncePerEpochInANewOrder) {
  auto loader = make(/*global_batch=*/4, 0, 1);
  const int64_t w = loader->windows_per_epoch();
  ASSERT_EQ(w, 62);
  const std::vector<int64_t> seen = take(*loader, 3 * w);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> epoch(seen.begin() + e * w, seen.begin() + (e + 1) * w);
    EXPECT_EQ(epoch, epoch_permutation(7, e, w));
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < w; ++i) EXPECT_EQ(sorted[i], i);
    epochs.push_back(epoch);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  EXPECT_NE(epoch_permutation(8, 0, w), epochs[0]);  // the seed matters
}

TEST_F(LoaderTest, RankSlicesAreDisjointAndComplete) {
  const int64_t global = 12, steps = 20;  // steps straddle epochs (62 is not a multiple of 12)
  auto single = make(global, 0, 1);
  const std::vector<int64_t> reference = take(*single, global * steps, /*micro=*/global);
  for (const int size : {2, 3, 4}) {
    std::vector<std::vector<int64_t>> per_rank;
    for (int rank = 0; rank < size; ++rank) {
      auto loader = make(global, rank, size);
      per_rank.push_back(take(*loader, global / size * steps, /*micro=*/2));
    }
    const int64_t local = global / size;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<int64_t> step;
      for (int rank = 0; rank < size; ++rank)
        step.insert(step.end(), per_rank[rank].begin() + s * local,
                    per_rank[rank].begin() + (s + 1) * local);
      EXPECT_EQ(step, std::vector<int64_t>(reference.begin() + s * global,
                                           reference.begin() + (s + 1) * global))
          << "dp_size " << size << " step " << s;
    }
  }
}

TEST_F(LoaderTest, MicroBatchSizeDoesNotChangeTheStream) {
  auto one = make(8, 1, 2);
  auto four = make(8, 1, 2);
  EXPECT_EQ(take(*one, 80, 1), take(*four, 80, 4));
}

TEST_F(LoaderTest, RestoreContinuesExactly) {
  auto loader = make(6, 1, 3);
  take(*loader, 2 * 25 + 1);  // into the middle of step 25 (epoch 2)
  const LoaderState state = loader->state();
  EXPECT_EQ(state.epoch, 150 / 62);
  EXPECT_EQ(state.position, 150 % 62);
  EXPECT_EQ(state.consumed, 1);
  const std::vector<int64_t> expected = take(*loader, 40);

  auto resumed = make(6, 1, 3);
  take(*resumed, 7);  // its read-ahead is somewhere else entirely
  ASSERT_TRUE(resumed->restore(state).ok());
  EXPECT_EQ(resumed->state(), state);
  EXPECT_EQ(take(*resumed, 40), expected);

  // At a step boundary the state is layout-free: one rank holding the whole batch
  // continues with the union of the three ranks' slices.
  auto boundary = make(6, 0, 1);
  take(*boundary, 6 * 25);
  const LoaderState step_state = boundary->state();
  EXPECT_EQ(step_state.consumed, 0);
  auto whole = make(6, 0, 1);
  ASSERT_TRUE(whole->restore(step_state).ok());
  const std::vector<int64_t> next_step = take(*whole, 6);
  auto rank2 = make(6, 2, 3);
  ASSERT_TRUE(rank2->restore(step_state).ok());
  EXPECT_EQ(take(*rank2, 2), std::vector<int64_t>(next_step.begin() + 4, next_step.end()));

  EXPECT_TRUE(IsOneLineWith(message_of(resumed->restore({0, 62, 0})), "does not fit"));
  EXPECT_TRUE(IsOneLineWith(message_of(resumed->restore({0, 0, 2})), "does not fit"));
}

TEST_F(LoaderTest, DestroysCleanlyWhileReadingAhead) {
  for (int i = 0; i < 20; ++i) {
    auto loader = make(4, 0, 1, i);
    if (i % 2) take(*loader, 3);
  }
}

TEST_F(LoaderTest, ValidationWindowsInOrder) {
  auto val = TokenDataset::open(dir_.path().string(), "val");
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ(val->num_windows(kSeq), (200 - 1) / kSeq);
  std::vector<int32_t> ids(kSeq), targets(kSeq);
  for (int64_t w = 0; w < val->num_windows(kSeq); ++w) {
    ASSERT_TRUE(val->read_window(w, kSeq, ids.data(), targets.data()).ok());
    EXPECT_EQ(ids[0], w * kSeq);
    EXPECT_EQ(targets[kSeq - 1], w * kSeq + kSeq);
  }
}

TEST_F(LoaderTest, BadSettingsAreErrors) {
  LoaderOptions o;
  o.seq_len = kSeq;
  o.global_batch = 6;
  o.dp_size = 4;
  EXPECT_TRUE(IsOneLineWith(message_of(Loader::create(*dataset_, o).status()),
                            "global batch 6 is not a positive multiple of the 4"));
  o.dp_size = 1;
  o.seq_len = 1001;
  EXPECT_TRUE(IsOneLineWith(message_of(Loader::create(*dataset_, o).status()),
                            "fewer than one window of seq_len + 1 = 1002"));
}

TEST(LoaderErrorTest, IdAtOrAboveVocabSizeFailsTheBatch) {
  ScratchDir dir;
  // vocab 1000 and 4000 tokens: ids wrap (i % 1000), so one of them is patched to 0xFFFF.
  testing::write_position_dataset(dir.path().string(), {4000}, {}, 1000);
  const std::string shard = dir / "train-00000-of-00001.h5";
  std::string run;
  for (int i = 500; i < 520; ++i)
    run += std::string{static_cast<char>(i & 0xff), static_cast<char>(i >> 8)};
  const int64_t offset = testing::find_in_file(shard, run);
  ASSERT_GE(offset, 0);
  testing::patch_file(shard, offset, "\xFF\xFF");  // token 500
  DatasetOpenOptions unverified;                   // as if the index had the patched shard's sha256
  unverified.verify_checksums = false;
  auto dataset = TokenDataset::open(dir.path().string(), "train", unverified);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  LoaderOptions o;
  o.seq_len = 100;
  o.global_batch = 39;  // every window in the first step
  auto loader = Loader::create(*dataset, o);
  ASSERT_TRUE(loader.ok());
  std::vector<int32_t> ids(39 * 100), targets(39 * 100);
  const absl::Status status = (*loader)->next_batch(39, ids.data(), targets.data());
  EXPECT_TRUE(IsOneLineWith(message_of(status), shard + ": token 500 has id 65535"));
  // It stays failed rather than skipping data.
  EXPECT_FALSE((*loader)->next_batch(1, ids.data(), targets.data()).ok());
}

}  // namespace
}  // namespace switchyard
