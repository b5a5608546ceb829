#include "engine/parallel/host_map.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/comm/local_communicator.h"

namespace switchyard {
namespace {

TEST(DescribeHosts, GroupsConsecutiveRanksOfOneHost) {
  EXPECT_EQ(describe_hosts({"node-a", "node-a", "node-a", "node-b", "node-b"}),
            "ranks 0-2 on node-a, ranks 3-4 on node-b");
}

TEST(DescribeHosts, NamesASingleRankAlone) {
  EXPECT_EQ(describe_hosts({"node-a"}), "rank 0 on node-a");
  EXPECT_EQ(describe_hosts({"node-a", "node-b", "node-b"}),
            "rank 0 on node-a, ranks 1-2 on node-b");
}

TEST(DescribeHosts, AHostSeenAgainLaterIsANewEntry) {
  EXPECT_EQ(describe_hosts({"node-a", "node-b", "node-a"}),
            "rank 0 on node-a, rank 1 on node-b, rank 2 on node-a");
}

TEST(GatherHostNames, AWorldOfOneGivesThisHost) {
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  LocalCommunicator world;
  EXPECT_EQ(gather_host_names(world), std::vector<std::string>{name});
}

}  // namespace
}  // namespace switchyard
