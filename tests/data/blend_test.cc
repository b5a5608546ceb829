// Weighted blends: each source's share of every global batch, proportions over many
// steps within statistical bounds, the same batches under any data-parallel layout, and
// an exact resume in the middle of the sources' epochs, under another layout too.
#include "data/blend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "data/loader.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using ::switchyard::testing::IsOneLineWith;
using ::switchyard::testing::message_of;
using ::switchyard::testing::ScratchDir;

constexpr int64_t kSeq = 16;
// Source s's token ids start at s * kIdsPerSource, so a window's first id names its
// source and its window.
constexpr int64_t kIdsPerSource = 100000;

struct Drawn {
  size_t source = 0;
  int64_t window = 0;
  bool operator==(const Drawn&) const = default;
};

class BlendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 62, 48 and 12 windows: the small source goes through many epochs.
    const std::vector<int64_t> tokens = {1001, 777, 200};
    for (size_t s = 0; s < tokens.size(); ++s) {
      const std::string dir = dir_ / ("source" + std::to_string(s));
      testing::write_position_dataset(dir, {tokens[s]}, {100}, 1 << 20,
                                      static_cast<int64_t>(s) * kIdsPerSource);
      auto dataset = TokenDataset::open(dir, "train");
      ASSERT_TRUE(dataset.ok()) << dataset.status();
      datasets_.push_back(*dataset);
    }
  }

  std::unique_ptr<Loader> make(const std::vector<double>& weights, int64_t global_batch,
                               int rank, int size) {
    std::vector<LoaderSource> sources;
    for (size_t s = 0; s < weights.size(); ++s) sources.push_back({datasets_[s], weights[s]});
    LoaderOptions o;
    o.seq_len = kSeq;
    o.seed = 11;
    o.global_batch = global_batch;
    o.dp_rank = rank;
    o.dp_size = size;
    auto loader = Loader::create(sources, o);
    EXPECT_TRUE(loader.ok()) << loader.status();
    return std::move(*loader);
  }

  // The next `count` windows of a loader; checks each is a whole window of its source.
  static std::vector<Drawn> take(Loader& loader, int64_t count) {
    std::vector<Drawn> drawn;
    std::vector<int32_t> ids(kSeq), targets(kSeq);
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_TRUE(loader.next_batch(1, ids.data(), targets.data()).ok());
      const Drawn d{static_cast<size_t>(ids[0] / kIdsPerSource), (ids[0] % kIdsPerSource) / kSeq};
      EXPECT_EQ(ids[0] % kIdsPerSource % kSeq, 0);
      EXPECT_EQ(targets[kSeq - 1], ids[0] + kSeq);
      drawn.push_back(d);
    }
    return drawn;
  }

  // `steps` whole steps of a layout of `size` ranks, the ranks' slices concatenated.
  std::vector<Drawn> steps_over_ranks(const std::vector<double>& weights, int64_t global_batch,
                                      int size, int64_t steps, const LoaderState* from = nullptr) {
    std::vector<std::vector<Drawn>> per_rank;
    for (int r = 0; r < size; ++r) {
      auto loader = make(weights, global_batch, r, size);
      if (from) {
        EXPECT_TRUE(loader->restore(*from).ok());
      }
      per_rank.push_back(take(*loader, steps * global_batch / size));
    }
    std::vector<Drawn> all;
    const int64_t local = global_batch / size;
    for (int64_t s = 0; s < steps; ++s) {
      for (int r = 0; r < size; ++r)
        all.insert(all.end(), per_rank[r].begin() + s * local, per_rank[r].begin() + (s + 1) * local);
    }
    return all;
  }

  ScratchDir dir_;
  std::vector<TokenDataset> datasets_;
};

TEST(BlendScheduleTest, EachStepGivesEverySourceFloorOrCeilOfItsShare) {
  const std::vector<double> weights = {5, 3, 2};
  const int64_t g = 7;  // shares 3.5, 2.1 and 1.4 windows
  const BlendSchedule schedule(weights, 3, g);
  for (int64_t step = 0; step < 2000; ++step) {
    const std::vector<int64_t> b = schedule.bounds(step);
    ASSERT_EQ(b.size(), 4u);
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), g);
    for (size_t i = 0; i < weights.size(); ++i) {
      const double share = g * weights[i] / 10.0;
      const int64_t count = b[i + 1] - b[i];
      EXPECT_TRUE(count == std::floor(share) || count == std::ceil(share))
          << "step " << step << " source " << i << ": " << count;
    }
  }
}

TEST(BlendScheduleTest, ProportionsOverManyStepsWithinStatisticalBounds) {
  const std::vector<double> weights = {0.55, 0.3, 0.15};
  const int64_t g = 9;
  const int64_t steps = 20000;
  const std::vector<int64_t> drawn = BlendSchedule(weights, 5, g).drawn_before(steps);
  int64_t total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    // Each step's count is off its share by less than one, with mean 0 and variance at
    // most 1/4, independently: 5 standard deviations of the sum are 2.5 sqrt(steps).
    const double expected = weights[i] * g * steps;
    EXPECT_LE(std::abs(drawn[i] - expected), 2.5 * std::sqrt(static_cast<double>(steps)))
        << "source " << i << ": " << drawn[i] << " windows, expected " << expected;
    total += drawn[i];
  }
  EXPECT_EQ(total, g * steps);
}

TEST(BlendScheduleTest, DependsOnTheSeed) {
  const BlendSchedule a({1, 1}, 1, 5), b({1, 1}, 2, 5);
  int differ = 0;
  for (int64_t step = 0; step < 50; ++step) differ += a.bounds(step) != b.bounds(step);
  EXPECT_GT(differ, 10);
}

TEST_F(BlendTest, LoaderFollowsTheScheduleAndEachSourcesOwnEpochs) {
  const std::vector<double> weights = {5, 3, 2};
  const int64_t g = 7;
  const int64_t steps = 150;  // source 2 (12 windows) sees about 17 epochs
  auto loader = make(weights, g, 0, 1);
  const std::vector<Drawn> drawn = take(*loader, steps * g);
  const BlendSchedule schedule(weights, 11, g);
  std::vector<int64_t> next(3, 0);
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<int64_t> b = schedule.bounds(s);
    for (size_t i = 0; i < 3; ++i) {
      const int64_t windows = datasets_[i].num_windows(kSeq);
      for (int64_t slot = b[i]; slot < b[i + 1]; ++slot, ++next[i]) {
        const Drawn expected{i, epoch_permutation(source_seed(11, i), next[i] / windows,
                                                  windows)[next[i] % windows]};
        ASSERT_EQ(drawn[s * g + slot], expected) << "step " << s << " slot " << slot;
      }
    }
  }
  EXPECT_EQ(loader->windows_drawn(), next);
  EXPECT_EQ(next, schedule.drawn_before(steps));
}

TEST_F(BlendTest, OneSourceIsThePlainDataset) {
  LoaderOptions o;
  o.seq_len = kSeq;
  o.seed = 11;
  o.global_batch = 4;
  auto plain = Loader::create(datasets_[0], o);
  ASSERT_TRUE(plain.ok());
  auto blend = make({2.5}, 4, 0, 1);
  EXPECT_EQ(take(**plain, 200), take(*blend, 200));
}

TEST_F(BlendTest, SameBatchesUnderAnyLayout) {
  const std::vector<double> weights = {1, 1, 2};
  const std::vector<Drawn> one = steps_over_ranks(weights, 8, 1, 60);
  EXPECT_EQ(steps_over_ranks(weights, 8, 2, 60), one);
  EXPECT_EQ(steps_over_ranks(weights, 8, 4, 60), one);
}

TEST_F(BlendTest, ResumesExactlyMidEpochUnderAnotherLayout) {
  const std::vector<double> weights = {5, 3, 2};
  const int64_t g = 6;
  // The uninterrupted run: one rank, 80 steps.
  const std::vector<Drawn> whole = steps_over_ranks(weights, g, 1, 80);
  // The first step from 30 on where every source is in the middle of an epoch.
  const BlendSchedule schedule(weights, 11, g);
  int64_t stop = 30;
  auto at_epoch_end = [&](int64_t steps) {
    const std::vector<int64_t> drawn = schedule.drawn_before(steps);
    for (size_t i = 0; i < 3; ++i)
      if (drawn[i] % datasets_[i].num_windows(kSeq) == 0) return true;
    return false;
  };
  while (at_epoch_end(stop)) ++stop;
  ASSERT_LT(stop, 60);
  // Stopped there by a 2-rank run...
  auto stopped = make(weights, g, 1, 2);
  take(*stopped, stop * g / 2);
  const LoaderState state = stopped->state();
  EXPECT_EQ(state.consumed, 0);
  const std::vector<int64_t> drawn = stopped->windows_drawn();
  EXPECT_EQ(drawn, schedule.drawn_before(stop));
  // ...and resumed by 3 ranks: the resumed batches are the uninterrupted run's.
  const std::vector<Drawn> resumed = steps_over_ranks(weights, g, 3, 80 - stop, &state);
  EXPECT_EQ(resumed, std::vector<Drawn>(whole.begin() + stop * g, whole.end()));
  auto again = make(weights, g, 0, 3);
  ASSERT_TRUE(again->restore(state).ok());
  EXPECT_EQ(again->windows_drawn(), drawn);

  // Inside a step, the same layout continues exactly too.
  auto mid = make(weights, g, 1, 2);
  take(*mid, stop * g / 2 + 1);
  const LoaderState mid_state = mid->state();
  EXPECT_EQ(mid_state.consumed, 1);
  const std::vector<Drawn> expected = take(*mid, 20);
  auto restored = make(weights, g, 1, 2);
  take(*restored, 5);
  ASSERT_TRUE(restored->restore(mid_state).ok());
  EXPECT_EQ(take(*restored, 20), expected);
}

TEST_F(BlendTest, BadWeightsAndPositionsAreErrors) {
  LoaderOptions o;
  o.seq_len = kSeq;
  o.global_batch = 4;
  for (double bad : {0.0, -1.0, std::nan(""), double{INFINITY}}) {
    const auto loader = Loader::create({{datasets_[0], 1}, {datasets_[1], bad}}, o);
    EXPECT_TRUE(IsOneLineWith(message_of(loader.status()), "blend weight must be positive"));
  }
  EXPECT_TRUE(IsOneLineWith(message_of(Loader::create(std::vector<LoaderSource>{}, o).status()),
                            "needs a data source"));
  auto loader = make({1, 1}, 4, 0, 1);
  // 122 windows per nominal epoch; position 6 is not a multiple of the batch of 4.
  EXPECT_TRUE(IsOneLineWith(message_of(loader->restore({0, 6, 0})), "not at a step boundary"));
  EXPECT_TRUE(IsOneLineWith(message_of(loader->restore({0, 122, 0})), "does not fit"));
  EXPECT_TRUE(IsOneLineWith(message_of(loader->restore({INT64_MAX / 2, 0, 0})), "does not fit"));
}

}  // namespace
}  // namespace switchyard
