// The one expert-capacity definition: ceil(cf x tokens x k / E) rounded in f32, and
// expert choice's clamp to [1, tokens].
#include "moe/capacity.h"

#include <gtest/gtest.h>

namespace switchyard {
namespace {

TEST(CapacityTest, RoundsUpTheFactorTimesTheFairShare) {
  EXPECT_EQ(expert_capacity(1.0f, 64, 2, 8), 16);
  EXPECT_EQ(expert_capacity(1.25f, 64, 2, 8), 20);
  EXPECT_EQ(expert_capacity(1.0f, 10, 1, 4), 3);  // 2.5 rounds up
  EXPECT_EQ(expert_capacity(0.5f, 3, 1, 8), 1);
  // 1.1 is not exact in f32; rounded in f32 the product is the intended 110, not 111.
  EXPECT_EQ(expert_capacity(1.1f, 100, 1, 1), 110);
}

TEST(CapacityTest, ExpertChoiceReadsZeroAsOneAndKeepsOneToEveryToken) {
  EXPECT_EQ(expert_choice_capacity(0.0f, 64, 2, 8), 16);
  EXPECT_EQ(expert_choice_capacity(1.5f, 64, 2, 8), 24);
  EXPECT_EQ(expert_choice_capacity(100.0f, 64, 2, 8), 64);  // at most every token
  EXPECT_EQ(expert_choice_capacity(0.01f, 4, 1, 8), 1);     // at least one
  EXPECT_EQ(expert_choice_capacity(1.0f, 0, 1, 8), 1);
}

}  // namespace
}  // namespace switchyard
