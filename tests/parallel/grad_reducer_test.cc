// Bucketed, overlapped data-parallel gradient reduction against one all-reduce of the
// whole flat buffer: the same bits, on the background thread and on the calling one.
#include "engine/optim/grad_reducer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "engine/parallel/mpi_communicator.h"
#include "engine/parallel/mpi_runtime.h"
#include "tests/parallel/parallel_test_env.h"

namespace switchyard {
namespace {

using testing::values_of;
using testing::world;

// A communicator over the world of its own, as the trainer's dp_background is.
std::unique_ptr<Communicator> own_world() {
  if (!MpiRuntime::get().launched()) return MpiRuntime::get().world_communicator();
  return MpiCommunicator::duplicate(MPI_COMM_WORLD);
}

// Three units of dense parameters (with an expert one between, which has its own flat
// buffer) and gradients that differ by rank and are not dyadic, so that any change in
// summation order would show.
struct Model {
  ParamStore params;
  Model() {
    params.begin_unit();
    params.add("embed", {7, 5}, ShardSpec{}, ParamInit::kZeros);
    params.begin_unit();
    params.add("block.a", {5, 3}, ShardSpec{}, ParamInit::kZeros);
    params.add("block.experts", {4, 3}, ShardSpec{.expert = true}, ParamInit::kZeros);
    params.add("block.b", {11}, ShardSpec{}, ParamInit::kZeros);
    params.begin_unit();
    params.add("head", {2, 9}, ShardSpec{}, ParamInit::kZeros);
    params.allocate(cpu_device());
    float* g = params.dense_grads().data<float>();
    for (int64_t i = 0; i < params.dense_grads().numel(); ++i)
      g[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(world().rank()));
  }
};

void check_against_one_all_reduce(bool background) {
  Model reference, bucketed;
  world().all_reduce_sum(reference.params.dense_grads());
  {
    OverlappedGradReduce reducer(bucketed.params, own_world(), background);
    reducer.set_reducing(true);
    for (int unit : {2, 1, 0}) reducer.end_grads(unit);  // backward order
    reducer.wait();
  }
  EXPECT_EQ(values_of<float>(bucketed.params.dense_grads()),
            values_of<float>(reference.params.dense_grads()));
}

TEST(OverlappedGradReduceTest, BackgroundBucketsEqualOneAllReduce) {
  check_against_one_all_reduce(/*background=*/true);
}

TEST(OverlappedGradReduceTest, InlineBucketsEqualOneAllReduce) {
  check_against_one_all_reduce(/*background=*/false);
}

TEST(OverlappedGradReduceTest, OnlyTheReducingMicroBatchReduces) {
  Model model;
  const std::vector<float> before = values_of<float>(model.params.dense_grads());
  OverlappedGradReduce reducer(model.params, own_world(), /*background=*/true);
  reducer.set_reducing(false);
  for (int unit : {2, 1, 0}) reducer.end_grads(unit);
  reducer.wait();
  EXPECT_EQ(values_of<float>(model.params.dense_grads()), before);
}

TEST(OverlappedGradReduceTest, OpenMpiLetsThreadsCommunicate) {
  if (!MpiRuntime::get().launched()) GTEST_SKIP() << "not under mpirun";
  EXPECT_TRUE(MpiRuntime::get().threads_communicate());
}

}  // namespace
}  // namespace switchyard
