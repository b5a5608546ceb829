// The op clock (core/runtime/op_clock.h): off, it records nothing; on, nested scopes each
// keep the time spent outside their inner scopes, so the kinds add up to the outermost
// scope's time, and take() starts a new interval.
#include "core/runtime/op_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace switchyard {
namespace {

using Clock = std::chrono::steady_clock;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

class OpClockTest : public ::testing::Test {
 protected:
  void TearDown() override { OpClock::enable(false); }
};

TEST_F(OpClockTest, RecordsNothingWhenOff) {
  OpClock::enable(false);
  {
    const OpScope scope(OpKind::kExperts, OpPass::kForward, cpu_device());
    sleep_ms(2);
  }
  EXPECT_EQ(OpClock::take().total(), 0.0);
}

TEST_F(OpClockTest, NestedScopesKeepTheirOwnTimeAndAddUpToTheOutermost) {
  OpClock::enable(true);
  const auto start = Clock::now();
  {
    const OpScope step(OpKind::kOther, OpPass::kForward, cpu_device());
    sleep_ms(3);
    {
      const OpScope experts(OpKind::kExperts, OpPass::kBackward, cpu_device());
      sleep_ms(5);
      const OpScope combine(OpKind::kCombine, OpPass::kBackward, cpu_device());
      sleep_ms(4);
    }
  }
  const double outside = std::chrono::duration<double>(Clock::now() - start).count();
  const OpTimes times = OpClock::take();
  EXPECT_GE(times.at(OpKind::kOther, OpPass::kForward), 0.003);
  EXPECT_GE(times.at(OpKind::kExperts, OpPass::kBackward), 0.005);
  EXPECT_GE(times.at(OpKind::kCombine, OpPass::kBackward), 0.004);
  EXPECT_EQ(times.at(OpKind::kExperts, OpPass::kForward), 0.0);
  // Were a parent to keep its inner scopes' time too, the kinds would add up to more than
  // the time that passed (by at least 4 + 9 ms here).
  EXPECT_LE(times.total(), outside);
  EXPECT_EQ(OpClock::take().total(), 0.0);
}

TEST_F(OpClockTest, TimesAddAndDivide) {
  OpTimes a;
  a.seconds[0][static_cast<int>(OpKind::kRouter)] = 1.0;
  a.seconds[1][static_cast<int>(OpKind::kRouter)] = 3.0;
  OpTimes b = a;
  b += a;
  const OpTimes half = b.divided_by(4.0);
  EXPECT_EQ(half.at(OpKind::kRouter, OpPass::kForward), 0.5);
  EXPECT_EQ(half.at(OpKind::kRouter, OpPass::kBackward), 1.5);
  EXPECT_EQ(half.total(), 2.0);
}

TEST_F(OpClockTest, EveryKindHasAName) {
  for (int k = 0; k < kNumOpKinds; ++k)
    EXPECT_NE(op_kind_name(static_cast<OpKind>(k)), "?") << k;
}

}  // namespace
}  // namespace switchyard
