// Fine-tuning's optimizer settings on one process, without ZeRO and with ZeRO-2/3 row
// shards: optimizer.router_lr_scale moves the router by exactly the AdamW update of the
// scaled learning rate and the rest by the scheduled one (0 leaves the router as it is);
// a frozen parameter (train.freeze) stays bit for bit as it was, holds no optimizer
// state, is not counted in the optimizer's memory bound nor in ZeRO-1's balance of state.
// Under optimizer.algorithm MUON the attention matrix trains with Muon (one momentum) and
// the router and the norm with AdamW as before, alike at every ZeRO stage.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/local_communicator.h"
#include "core/runtime/device.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/zero.h"

namespace switchyard {
namespace {

constexpr char kRouter[] = "model.layers.0.mlp.gate.weight";
constexpr char kAttention[] = "model.layers.0.self_attn.q_proj.weight";
constexpr char kNorm[] = "model.norm.weight";
constexpr int64_t kAttentionElements = 6 * 6;
constexpr float kLr = 1e-2f;

config::OptimizerConfig adamw(float lr) {
  config::OptimizerConfig opt;
  opt.set_lr(lr);
  opt.set_decay(config::CONSTANT);
  opt.set_beta1(0.9f);
  opt.set_beta2(0.95f);
  opt.set_eps(1e-8f);
  opt.set_weight_decay(0.1f);
  return opt;
}

config::OptimizerConfig muon(float lr) {
  config::OptimizerConfig opt = adamw(lr);
  opt.set_algorithm(config::MUON);
  config::MuonConfig& m = *opt.mutable_muon();
  m.set_momentum(0.95f);
  m.set_nesterov(true);
  m.set_ns_steps(5);
  m.set_ns_a(3.4445f);
  m.set_ns_b(-4.7750f);
  m.set_ns_c(2.0315f);
  m.set_update_rms(0.2f);
  m.set_eps(1e-7f);
  return opt;
}

config::OptimizerConfig with_router_lr_scale(float scale) {
  config::OptimizerConfig opt = adamw(kLr);
  opt.set_router_lr_scale(scale);
  return opt;
}

struct Trained {
  std::map<std::string, std::vector<float>> values;  // by name, after training
  int64_t state_elements = 0;  // moments held, ZeRO row shards included
};

// A router, an attention matrix and a norm gain, trained for `steps` AdamW steps on fixed
// gradients, without ZeRO (stage 0) or with stage 2/3 row shards over one replica;
// `frozen` names a parameter to freeze.
Trained train(const config::OptimizerConfig& opt, int zero_stage, const std::string& frozen = "",
          int steps = 2) {
  LocalCommunicator tp, ep, dp, expert_dp;
  ParamStore params;
  params.add(kRouter, {4, 6}, ShardSpec{}, ParamInit::kNormal, 0.02f);
  params.add(kAttention, {6, 6}, ShardSpec{}, ParamInit::kNormal, 0.02f);
  params.add(kNorm, {6}, ShardSpec{}, ParamInit::kOnes);
  for (Param& p : params.params()) p.trainable = p.name != frozen;
  Device& dev = cpu_device();
  std::unique_ptr<ZeroShards> zero;
  if (zero_stage >= 2)
    zero = std::make_unique<ZeroShards>(params, dp, zero_stage, dev,
                                        std::make_unique<LocalCommunicator>(), false, opt);
  Trained run;
  params.allocate(dev);
  params.initialize(7);
  if (zero) zero->initialize(7);
  AdamWOptimizer optimizer(opt, 10, params, {&tp, &ep, &dp, &expert_dp, zero_stage, zero.get()},
                           dev);
  for (int step = 1; step <= steps; ++step) {
    if (zero) {
      zero->acquire(0);
      zero->begin_grads(0);
    }
    for (Param& p : params.params())
      for (int64_t k = 0; k < p.grad.numel(); ++k)
        p.grad.data<float>()[k] = 0.01f * static_cast<float>((k * 7 + step) % 11) - 0.05f;
    if (zero) {
      zero->end_grads(0);
      zero->release(0);
      zero->wait();
    }
    optimizer.step(dev);
  }
  size_t i = 0;
  for (Param& p : params.params()) {
    const Tensor value = zero ? zero->whole_value(p) : p.value;
    run.values[p.name].assign(value.data<float>(), value.data<float>() + value.numel());
    const bool sharded = zero && zero->is_sharded(i);
    for (const Tensor* state :
         sharded ? std::vector<const Tensor*>{&zero->shard(i).exp_avg, &zero->shard(i).exp_avg_sq,
                                              &zero->shard(i).momentum}
                 : std::vector<const Tensor*>{&optimizer.exp_avg(i), &optimizer.exp_avg_sq(i),
                                              &optimizer.momentum(i)})
      run.state_elements += state->numel();
    ++i;
  }
  return run;
}

class FineTuneOptimizer : public ::testing::TestWithParam<int> {};  // the ZeRO stage

TEST_P(FineTuneOptimizer, RouterMovesByTheUpdateOfTheScaledLr) {
  const float scale = 0.25f;
  const Trained scaled = train(with_router_lr_scale(scale), GetParam());
  // The same steps with the scaled rate for every parameter, and with the scheduled one.
  const Trained at_router_lr = train(adamw(static_cast<float>(double{kLr} * scale)), GetParam());
  const Trained at_lr = train(adamw(kLr), GetParam());
  EXPECT_EQ(scaled.values.at(kRouter), at_router_lr.values.at(kRouter));
  EXPECT_NE(scaled.values.at(kRouter), at_lr.values.at(kRouter));
  EXPECT_EQ(scaled.values.at(kAttention), at_lr.values.at(kAttention));
  EXPECT_EQ(scaled.values.at(kNorm), at_lr.values.at(kNorm));
  // Every layout updates alike.
  EXPECT_EQ(scaled.values, train(with_router_lr_scale(scale), 0).values);
}

TEST_P(FineTuneOptimizer, RouterLrScaleZeroLeavesTheRouterAsItIs) {
  const Trained initial = train(adamw(kLr), GetParam(), "", 0);
  const Trained trained = train(with_router_lr_scale(0.0f), GetParam());
  EXPECT_EQ(trained.values.at(kRouter), initial.values.at(kRouter));
  EXPECT_NE(trained.values.at(kAttention), initial.values.at(kAttention));
}

TEST_P(FineTuneOptimizer, FrozenParameterStaysAsItIsWithNoState) {
  const Trained initial = train(adamw(kLr), GetParam(), "", 0);
  const Trained all = train(adamw(kLr), GetParam());
  const Trained frozen = train(adamw(kLr), GetParam(), kAttention);
  EXPECT_EQ(frozen.values.at(kAttention), initial.values.at(kAttention));
  EXPECT_NE(all.values.at(kAttention), initial.values.at(kAttention));
  EXPECT_EQ(frozen.values.at(kRouter), all.values.at(kRouter));  // no clipping: unaffected
  EXPECT_EQ(frozen.values.at(kNorm), all.values.at(kNorm));
  EXPECT_EQ(all.state_elements - frozen.state_elements, 2 * kAttentionElements);
}

TEST_P(FineTuneOptimizer, MuonTrainsTheMatrixWithOneMomentumAndAdamWTheRest) {
  const Trained initial = train(adamw(kLr), GetParam(), "", 0);
  const Trained with_adamw = train(adamw(kLr), GetParam());
  const Trained with_muon = train(muon(kLr), GetParam());
  EXPECT_NE(with_muon.values.at(kAttention), with_adamw.values.at(kAttention));
  EXPECT_NE(with_muon.values.at(kAttention), initial.values.at(kAttention));
  EXPECT_EQ(with_muon.values.at(kRouter), with_adamw.values.at(kRouter));
  EXPECT_EQ(with_muon.values.at(kNorm), with_adamw.values.at(kNorm));
  EXPECT_EQ(with_adamw.state_elements - with_muon.state_elements, kAttentionElements);
  EXPECT_EQ(with_muon.values, train(muon(kLr), 0).values);
  // Frozen, the matrix stays as it is and holds no momentum.
  const Trained frozen = train(muon(kLr), GetParam(), kAttention);
  EXPECT_EQ(frozen.values.at(kAttention), initial.values.at(kAttention));
  EXPECT_EQ(with_muon.state_elements - frozen.state_elements, kAttentionElements);
}

TEST(AssignOwners, BalancesTheStateOfTrainableParametersOnly) {
  ParamStore params;
  params.add("frozen", {8, 8}, ShardSpec{}, ParamInit::kZeros).trainable = false;
  params.add("a", {4}, ShardSpec{}, ParamInit::kZeros);
  params.add("b", {4}, ShardSpec{}, ParamInit::kZeros);
  const std::vector<int> owners = assign_owners(params, 2, 1);
  EXPECT_NE(owners[1], owners[2]);
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, FineTuneOptimizer, ::testing::Values(0, 2, 3));

}  // namespace
}  // namespace switchyard
