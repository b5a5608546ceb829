// Layout arithmetic for several shapes, the launch checks of make_layout, and the
// communicators of make_process_groups: under mpirun every rank checks that each of
// its groups holds exactly the ranks the Layout names, in order.
#include "engine/parallel/topology.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/parallel/mpi_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/parallel/parallel_test_env.h"

namespace switchyard {
namespace {

using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

config::Recipe recipe_for(int tp, int ep) {
  config::Recipe recipe;
  recipe.mutable_model()->set_num_heads(8);
  recipe.mutable_model()->set_num_kv_heads(4);
  recipe.mutable_moe()->set_num_experts(8);
  recipe.mutable_parallel()->set_tensor_parallel_size(tp);
  recipe.mutable_parallel()->set_expert_parallel_size(ep);
  recipe.mutable_train()->set_global_batch_size(16);
  recipe.mutable_train()->set_micro_batch_size(2);
  return recipe;
}

Layout layout_for(int world_size, int tp, int ep) {
  absl::StatusOr<Layout> layout = make_layout(recipe_for(tp, ep), world_size);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return layout.ok() ? *layout : Layout{};
}

// Each rank's group of one kind, listed for rank 0, 1, ...
struct ExpectedGroups {
  Groups tp, dp, ep, expert_dp;
};

void expect_groups(const Layout& layout, const ExpectedGroups& expected) {
  for (int rank = 0; rank < layout.world_size; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(layout.tp_group(rank), expected.tp[rank]);
    EXPECT_EQ(layout.dp_group(rank), expected.dp[rank]);
    EXPECT_EQ(layout.ep_group(rank), expected.ep[rank]);
    EXPECT_EQ(layout.expert_dp_group(rank), expected.expert_dp[rank]);
    // A rank's index in each group is its position in the member list.
    EXPECT_EQ(layout.tp_group(rank)[layout.tp_index(rank)], rank);
    EXPECT_EQ(layout.dp_group(rank)[layout.dp_index(rank)], rank);
    EXPECT_EQ(layout.ep_group(rank)[layout.ep_index(rank)], rank);
    EXPECT_EQ(layout.expert_dp_group(rank)[layout.expert_dp_index(rank)], rank);
  }
}

TEST(LayoutTest, World4Tp2Ep2) {
  const Layout layout = layout_for(4, 2, 2);
  EXPECT_EQ(layout.data_parallel_size, 2);
  EXPECT_EQ(layout.expert_data_parallel_size, 2);
  EXPECT_EQ(layout.num_local_experts, 4);
  EXPECT_EQ(layout.micro_batches_per_step, 4);  // 16 / (dp 2 x micro 2)
  expect_groups(layout, {.tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}},
                         .dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}},
                         .ep = {{0, 1}, {0, 1}, {2, 3}, {2, 3}},
                         .expert_dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}}});
}

TEST(LayoutTest, World4Tp1Ep4) {
  const Layout layout = layout_for(4, 1, 4);
  EXPECT_EQ(layout.data_parallel_size, 4);
  EXPECT_EQ(layout.expert_data_parallel_size, 1);
  EXPECT_EQ(layout.num_local_experts, 2);
  EXPECT_EQ(layout.micro_batches_per_step, 2);
  const std::vector<int> all = {0, 1, 2, 3};
  expect_groups(layout, {.tp = {{0}, {1}, {2}, {3}},
                         .dp = {all, all, all, all},
                         .ep = {all, all, all, all},
                         .expert_dp = {{0}, {1}, {2}, {3}}});
}

TEST(LayoutTest, World4Tp1Ep2) {
  const Layout layout = layout_for(4, 1, 2);
  EXPECT_EQ(layout.expert_data_parallel_size, 2);
  const std::vector<int> all = {0, 1, 2, 3};
  expect_groups(layout, {.tp = {{0}, {1}, {2}, {3}},
                         .dp = {all, all, all, all},
                         .ep = {{0, 1}, {0, 1}, {2, 3}, {2, 3}},
                         .expert_dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}}});
}

TEST(LayoutTest, World2Tp2Ep1) {
  const Layout layout = layout_for(2, 2, 1);
  EXPECT_EQ(layout.data_parallel_size, 1);
  EXPECT_EQ(layout.micro_batches_per_step, 8);
  expect_groups(
      layout,
      {.tp = {{0, 1}, {0, 1}}, .dp = {{0}, {1}}, .ep = {{0}, {1}}, .expert_dp = {{0, 1}, {0, 1}}});
}

TEST(LayoutTest, World8Tp2Ep4) {
  const Layout layout = layout_for(8, 2, 4);
  expect_groups(layout,
                {.tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4, 5}, {4, 5}, {6, 7}, {6, 7}},
                 .dp = {{0, 2, 4, 6},
                        {1, 3, 5, 7},
                        {0, 2, 4, 6},
                        {1, 3, 5, 7},
                        {0, 2, 4, 6},
                        {1, 3, 5, 7},
                        {0, 2, 4, 6},
                        {1, 3, 5, 7}},
                 .ep = {{0, 1, 2, 3},
                        {0, 1, 2, 3},
                        {0, 1, 2, 3},
                        {0, 1, 2, 3},
                        {4, 5, 6, 7},
                        {4, 5, 6, 7},
                        {4, 5, 6, 7},
                        {4, 5, 6, 7}},
                 .expert_dp = {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}}});
}

TEST(LayoutTest, ZeroFieldsTakeTheirDefaults) {
  config::Recipe recipe = recipe_for(0, 0);
  recipe.mutable_train()->set_micro_batch_size(0);
  absl::StatusOr<Layout> layout = make_layout(recipe, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tensor_parallel_size, 1);
  EXPECT_EQ(layout->expert_parallel_size, 1);
  EXPECT_EQ(layout->micro_batch_size, 16);
  EXPECT_EQ(layout->micro_batches_per_step, 1);
}

void expect_error(const config::Recipe& recipe, int world_size, const std::string& field) {
  absl::StatusOr<Layout> layout = make_layout(recipe, world_size);
  ASSERT_FALSE(layout.ok()) << "expected an error naming " << field;
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr(field));
  EXPECT_EQ(std::string(layout.status().message()).find('\n'), std::string::npos);
}

TEST(LayoutTest, ErrorsNameTheField) {
  expect_error(recipe_for(1, 1), 0, "world size");
  expect_error(recipe_for(3, 1), 4, "parallel.tensor_parallel_size (3) must divide the world");
  expect_error(recipe_for(-1, 1), 4, "parallel.tensor_parallel_size");
  expect_error(recipe_for(1, 3), 4, "parallel.expert_parallel_size (3) must divide the world");

  config::Recipe heads = recipe_for(4, 1);
  heads.mutable_model()->set_num_heads(6);
  heads.mutable_model()->set_num_kv_heads(0);
  expect_error(heads, 4, "model.num_heads (6)");

  config::Recipe kv_heads = recipe_for(4, 1);
  kv_heads.mutable_model()->set_num_kv_heads(2);
  expect_error(kv_heads, 4, "model.num_kv_heads (2)");

  config::Recipe vocab = recipe_for(2, 1);
  vocab.mutable_model()->set_vocab_size(1001);
  expect_error(vocab, 4, "model.vocab_size (1001) must be divisible by parallel.tensor_parallel_size");

  config::Recipe tokens = recipe_for(4, 1);
  tokens.mutable_train()->set_micro_batch_size(1);
  tokens.mutable_train()->set_seq_len(6);
  expect_error(tokens, 4, "train.micro_batch_size x train.seq_len (6 tokens)");

  config::Recipe experts = recipe_for(1, 4);
  experts.mutable_moe()->set_num_experts(6);
  expect_error(experts, 4, "moe.num_experts (6)");

  config::Recipe batch = recipe_for(1, 1);
  batch.mutable_train()->set_global_batch_size(6);
  expect_error(batch, 2, "train.global_batch_size (6)");
  expect_error(batch, 2, "train.micro_batch_size (2)");

  config::Recipe no_batch = recipe_for(1, 1);
  no_batch.mutable_train()->set_global_batch_size(0);
  no_batch.mutable_train()->set_micro_batch_size(0);
  expect_error(no_batch, 1, "train.global_batch_size (0)");
}

// The members of `group` as world ranks, in group-rank order.
std::vector<int> members(Communicator& group) {
  Tensor mine = Tensor::empty({1}, DType::kI64);
  mine.data<int64_t>()[0] = testing::world().rank();
  Tensor all = Tensor::empty({group.size()}, DType::kI64);
  group.all_gather(mine, all);
  return std::vector<int>(all.data<int64_t>(), all.data<int64_t>() + group.size());
}

// Every (tp, ep) that fits the running world, built with real communicators.
TEST(ProcessGroupsTest, GroupsHoldTheLayoutsRanks) {
  const int world_size = testing::world().size();
  const int rank = testing::world().rank();
  ASSERT_EQ(MpiRuntime::get().world_size(), world_size);
  int layouts_checked = 0;
  for (int tp : {1, 2, 4}) {
    for (int ep : {1, 2, 4}) {
      if (world_size % tp != 0 || world_size % ep != 0) continue;
      SCOPED_TRACE("tp " + std::to_string(tp) + " ep " + std::to_string(ep));
      const Layout layout = layout_for(world_size, tp, ep);
      ProcessGroups groups = make_process_groups(layout);
      const std::vector<int> world_members = members(*groups.world);
      const std::vector<int> tp_members = members(*groups.tp);
      const std::vector<int> dp_members = members(*groups.dp);
      const std::vector<int> ep_members = members(*groups.ep);
      const std::vector<int> expert_dp_members = members(*groups.expert_dp);

      std::vector<int> everyone;
      for (int r = 0; r < world_size; ++r) everyone.push_back(r);
      EXPECT_EQ(world_members, everyone);
      EXPECT_EQ(tp_members, layout.tp_group(rank));
      EXPECT_EQ(dp_members, layout.dp_group(rank));
      EXPECT_EQ(ep_members, layout.ep_group(rank));
      EXPECT_EQ(expert_dp_members, layout.expert_dp_group(rank));
      EXPECT_EQ(groups.world->rank(), rank);
      EXPECT_EQ(groups.tp->rank(), layout.tp_index(rank));
      EXPECT_EQ(groups.dp->rank(), layout.dp_index(rank));
      EXPECT_EQ(groups.ep->rank(), layout.ep_index(rank));
      EXPECT_EQ(groups.expert_dp->rank(), layout.expert_dp_index(rank));
      ++layouts_checked;
    }
  }
  EXPECT_GE(layouts_checked, 1);
}

}  // namespace
}  // namespace switchyard
