// The learning-rate schedule (warmup, cosine, linear, constant, min_lr), global
// gradient-norm clipping and the refusal of non-finite gradients, on one process.
#include "engine/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/comm/local_communicator.h"
#include "core/runtime/device.h"

namespace switchyard {
namespace {

config::OptimizerConfig schedule(config::LrDecay decay, int64_t warmup) {
  config::OptimizerConfig opt;
  opt.set_lr(1e-3f);
  opt.set_min_lr(1e-4f);
  opt.set_warmup_steps(warmup);
  opt.set_decay(decay);
  return opt;
}

TEST(LearningRate, WarmupRisesLinearlyFromZeroToLr) {
  const config::OptimizerConfig opt = schedule(config::COSINE, 10);
  const double lr = opt.lr();
  for (int64_t step = 1; step <= 10; ++step)
    EXPECT_DOUBLE_EQ(learning_rate(opt, step, 110), lr * step / 10.0) << step;
}

TEST(LearningRate, CosineFallsFromLrToMinLrAtTheLastStep) {
  const config::OptimizerConfig opt = schedule(config::COSINE, 10);
  const double lr = opt.lr(), min_lr = opt.min_lr();
  EXPECT_DOUBLE_EQ(learning_rate(opt, 60, 110), (lr + min_lr) / 2);  // half way
  EXPECT_DOUBLE_EQ(learning_rate(opt, 35, 110),
                   min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI * 0.25)));
  EXPECT_DOUBLE_EQ(learning_rate(opt, 110, 110), min_lr);
  double previous = learning_rate(opt, 10, 110);
  for (int64_t step = 11; step <= 110; ++step) {
    const double now = learning_rate(opt, step, 110);
    EXPECT_LT(now, previous) << step;
    previous = now;
  }
}

TEST(LearningRate, UnspecifiedDecayIsCosine) {
  const config::OptimizerConfig cosine = schedule(config::COSINE, 5);
  const config::OptimizerConfig unspecified = schedule(config::LR_DECAY_UNSPECIFIED, 5);
  for (int64_t step = 1; step <= 50; ++step)
    EXPECT_DOUBLE_EQ(learning_rate(unspecified, step, 50), learning_rate(cosine, step, 50));
}

TEST(LearningRate, LinearFallsInEqualStepsToMinLr) {
  const config::OptimizerConfig opt = schedule(config::LINEAR, 10);
  const double lr = opt.lr(), min_lr = opt.min_lr();
  EXPECT_DOUBLE_EQ(learning_rate(opt, 10, 110), lr);
  EXPECT_DOUBLE_EQ(learning_rate(opt, 35, 110), lr + (min_lr - lr) * 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(opt, 85, 110), lr + (min_lr - lr) * 0.75);
  EXPECT_DOUBLE_EQ(learning_rate(opt, 110, 110), min_lr);
}

TEST(LearningRate, ConstantKeepsLrAfterWarmup) {
  const config::OptimizerConfig opt = schedule(config::CONSTANT, 4);
  EXPECT_DOUBLE_EQ(learning_rate(opt, 2, 20), opt.lr() / 2);
  for (int64_t step = 4; step <= 20; ++step)
    EXPECT_DOUBLE_EQ(learning_rate(opt, step, 20), static_cast<double>(opt.lr())) << step;
}

TEST(LearningRate, StaysAtMinLrPastTheLastStep) {
  for (config::LrDecay decay : {config::COSINE, config::LINEAR}) {
    const config::OptimizerConfig opt = schedule(decay, 0);
    for (int64_t step : {100, 101, 150})
      EXPECT_DOUBLE_EQ(learning_rate(opt, step, 100), static_cast<double>(opt.min_lr())) << step;
  }
}

// One parameter "w" of 4 values whose gradient is `grad`, updated by one AdamW step.
struct OneParam {
  LocalCommunicator tp, ep, dp, expert_dp;
  ParamStore params;
  std::unique_ptr<AdamWOptimizer> optimizer;

  OneParam(const config::OptimizerConfig& opt, const std::vector<float>& grad) {
    params.add("w", {4}, ShardSpec{}, ParamInit::kOnes);
    params.allocate(cpu_device());
    params.initialize(1);
    AdamWOptimizer::Groups groups{&tp, &ep, &dp, &expert_dp, 0, nullptr};
    optimizer = std::make_unique<AdamWOptimizer>(opt, 10, params, groups, cpu_device());
    Param& w = params.params().front();
    for (int i = 0; i < 4; ++i) w.grad.data<float>()[i] = grad[static_cast<size_t>(i)];
  }
  std::vector<float> values() {
    const Param& w = params.params().front();
    return std::vector<float>(w.value.data<float>(), w.value.data<float>() + 4);
  }
  std::vector<float> grads() {
    const Param& w = params.params().front();
    return std::vector<float>(w.grad.data<float>(), w.grad.data<float>() + 4);
  }
};

// A large epsilon makes AdamW's first update depend on the gradient's size, so that
// clipping shows in the values.
config::OptimizerConfig adamw(float grad_clip) {
  config::OptimizerConfig opt = schedule(config::CONSTANT, 0);
  opt.set_eps(1.0f);
  opt.set_beta1(0.9f);
  opt.set_beta2(0.95f);
  opt.set_weight_decay(0.0f);
  opt.set_grad_clip(grad_clip);
  return opt;
}

TEST(GradClip, ScalesTheGradientToTheClipNorm) {
  OneParam clipped(adamw(1.0f), {3, 4, 0, 0});  // norm 5
  const StepReport report = clipped.optimizer->step(cpu_device());
  EXPECT_DOUBLE_EQ(report.grad_norm, 5.0);  // before clipping
  EXPECT_TRUE(report.clipped);
  // The same step with the gradient scaled by hand and no clipping.
  const float scale = static_cast<float>(1.0 / (5.0 + 1e-6));
  OneParam by_hand(adamw(0.0f), {3 * scale, 4 * scale, 0, 0});
  EXPECT_FALSE(by_hand.optimizer->step(cpu_device()).clipped);
  EXPECT_EQ(clipped.values(), by_hand.values());
  OneParam unclipped(adamw(0.0f), {3, 4, 0, 0});
  unclipped.optimizer->step(cpu_device());
  EXPECT_NE(clipped.values(), unclipped.values());
}

TEST(GradClip, LeavesAGradientWithinTheNormAlone) {
  OneParam clipped(adamw(10.0f), {3, 4, 0, 0});
  OneParam unclipped(adamw(0.0f), {3, 4, 0, 0});
  EXPECT_FALSE(clipped.optimizer->step(cpu_device()).clipped);
  unclipped.optimizer->step(cpu_device());
  EXPECT_EQ(clipped.values(), unclipped.values());
}

TEST(NonFiniteGradient, IsNamedAndUpdatesNothing) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    OneParam one(adamw(1.0f), {1, bad, 0, 0});
    const std::vector<float> before = one.values();
    const StepReport report = one.optimizer->step(cpu_device());
    EXPECT_TRUE(report.skipped);
    EXPECT_EQ(report.non_finite_grad, "w");
    EXPECT_EQ(one.values(), before);
    EXPECT_EQ(one.grads(), std::vector<float>(4, 0.0f));  // dropped, not carried over
    EXPECT_EQ(one.optimizer->steps_taken(), 1);
  }
}

}  // namespace
}  // namespace switchyard
