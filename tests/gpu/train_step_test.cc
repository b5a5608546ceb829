// Whole training steps on the GPU against the same steps on the CPU: the model's
// forward (every loss term), every parameter gradient, and the parameters after three
// AdamW steps, from identical initial values and data, in f32 and bf16. Covers dense and MoE
// layers, shared experts with their gate, q/k norms and biases, each gating variant (GShard's
// random second expert included) and a capacity factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

struct Case {
  std::string gating;  // moe.gating, and any moe settings after it
  float capacity_factor;
  DType compute = DType::kF32;
};

config::Recipe step_recipe(const Case& c) {
  const std::string text = R"(
    name: "gpu-step"
    model { vocab_size: 97 hidden_size: 48 num_layers: 3 num_heads: 6 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 ffn_hidden_size: 40 first_dense_layers: 1
            attention_bias: true qk_norm: true init_std: 0.05 }
    moe { num_experts: 6 top_k: 2 gating: )" +
                           c.gating + R"( capacity_factor: )" + std::to_string(c.capacity_factor) +
                           R"(
          aux_loss_coef: 0.01 z_loss_coef: 0.001 expert_ffn_hidden_size: 20
          num_shared_experts: 1 shared_expert_ffn_hidden_size: 16 shared_expert_gate: true }
    optimizer { lr: 3e-3 warmup_steps: 0 grad_clip: 1.0 }
    train { global_batch_size: 3 seq_len: 19 steps: 3 }
  )";
  auto recipe = config::parse_recipe(text, "gpu-step");
  SY_CHECK(recipe.ok());
  return *recipe;
}

// One model, its parameters and optimizer on one device.
struct Replica {
  Replica(const config::Recipe& recipe, Device& dev, DType compute)
      : dev(dev), model(recipe, params) {
    params.allocate(dev, compute);
    params.initialize(7);
    refresh_working_copies(dev, params);
    optimizer = std::make_unique<AdamWOptimizer>(recipe.optimizer(), recipe.train().steps(), params,
                                                 AdamWOptimizer::Groups{}, dev);
  }
  Device& dev;
  ParamStore params;
  Transformer model;
  std::unique_ptr<AdamWOptimizer> optimizer;
};

// Tolerances: f32 runs differ by summation order only; bf16 runs also by the bf16
// roundings that a different f32 sum moves across a rounding boundary.
void expect_close_losses(const LossParts& gpu, const LossParts& cpu, int step, bool bf16) {
  const double ce_tol = bf16 ? 5e-3 : 1e-5, tol = bf16 ? 2e-2 : 1e-4;
  EXPECT_NEAR(gpu.cross_entropy, cpu.cross_entropy, ce_tol * std::abs(cpu.cross_entropy))
      << "step " << step;
  EXPECT_NEAR(gpu.aux_loss, cpu.aux_loss, tol * std::abs(cpu.aux_loss)) << "step " << step;
  EXPECT_NEAR(gpu.z_loss, cpu.z_loss, tol * std::abs(cpu.z_loss)) << "step " << step;
  EXPECT_EQ(gpu.target_tokens, cpu.target_tokens);
}

// At least `share` of the elements within tol of the CPU's, relative to the tensor's
// largest magnitude (gradients mix tiny and large entries, and fp32 sums in another
// order differ by a few ulps of the large ones); none NaN, none further than `limit`
// (absolute).
void expect_close_tensors(const Tensor& gpu, const Tensor& cpu, double tol, double share,
                          double limit, const std::string& what) {
  const std::vector<float> g = testing::values_of<float>(gpu);
  const std::vector<float> c = testing::values_of<float>(cpu);
  ASSERT_EQ(g.size(), c.size()) << what;
  double scale = 0;
  for (float v : c) scale = std::max(scale, static_cast<double>(std::abs(v)));
  scale = std::max(scale, 1e-6);
  int64_t close = 0, wild = 0;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double diff = std::abs(static_cast<double>(g[i]) - c[i]);
    if (diff <= tol * scale) ++close;
    if (!(diff <= limit)) ++wild;  // NaN counts
    worst = std::max(worst, diff);
  }
  EXPECT_GE(static_cast<double>(close), share * static_cast<double>(g.size()))
      << what << ": largest difference " << worst << " against a scale of " << scale;
  EXPECT_EQ(wild, 0) << what << ": largest difference " << worst;
}

// Cosine similarity of two gradients (host or device f32 tensors).
double cosine(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = testing::values_of<float>(a), y = testing::values_of<float>(b);
  double dot = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    dot += static_cast<double>(x[i]) * y[i];
    xx += static_cast<double>(x[i]) * x[i];
    yy += static_cast<double>(y[i]) * y[i];
  }
  return dot / std::sqrt(std::max(xx * yy, 1e-300));
}

class TrainStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(TrainStepTest, GpuStepsMatchCpuSteps) {
  const config::Recipe recipe = step_recipe(GetParam());
  const bool bf16 = GetParam().compute == DType::kBF16;
  CudaDevice gpu_dev(0);
  Replica cpu(recipe, cpu_device(), GetParam().compute);
  Replica gpu(recipe, gpu_dev, GetParam().compute);

  const int64_t batch = 3, seq = 19, vocab = 97;
  for (int step = 1; step <= 3; ++step) {
    Tensor ids = Tensor::empty({batch, seq}, DType::kI32);
    Tensor targets = Tensor::empty({batch, seq}, DType::kI32);
    Rng data(100 + step);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(vocab));
      targets.data<int32_t>()[i] = i % 11 == 5 ? -1 : static_cast<int32_t>(data.below(vocab));
    }
    Rng cpu_routing(step), gpu_routing(step);
    const LossParts c = cpu.model.forward(cpu.dev, ids, targets, true, cpu_routing);
    const LossParts g = gpu.model.forward(gpu.dev, ids.to(gpu_dev), targets, true, gpu_routing);
    expect_close_losses(g, c, step, bf16);
    if (!bf16) {
      EXPECT_EQ(gpu.model.router_stats().dropped_assignments,
                cpu.model.router_stats().dropped_assignments);
    }
    cpu.model.backward(cpu.dev, 1.0f);
    gpu.model.backward(gpu.dev, 1.0f);
    if (step == 1) {
      for (size_t i = 0; i < cpu.params.params().size(); ++i) {
        const Tensor& gg = gpu.params.params()[i].grad;
        const Tensor& cg = cpu.params.params()[i].grad;
        const std::string what = "gradient of " + cpu.params.params()[i].name;
        if (bf16) {
          EXPECT_GT(cosine(gg, cg), 0.99) << what;
        } else {
          expect_close_tensors(gg, cg, 2e-4, 1.0, 1.0, what);
        }
      }
    }
    const StepReport rc = cpu.optimizer->step(cpu.dev);
    const StepReport rg = gpu.optimizer->step(gpu.dev);
    EXPECT_NEAR(rg.grad_norm, rc.grad_norm, (bf16 ? 2e-2 : 1e-4) * rc.grad_norm) << "step " << step;
  }
  if (bf16) return;  // the masters then differ by more than AdamW's sign flips
  // AdamW's first steps move each weight by about lr whatever its gradient's size, so a
  // gradient near zero whose sign differs by rounding moves a weight the other way:
  // most weights agree closely, none by more than two updates per step.
  const double lr = recipe.optimizer().lr();
  for (size_t i = 0; i < cpu.params.params().size(); ++i)
    expect_close_tensors(gpu.params.params()[i].value, cpu.params.params()[i].value, 1e-4, 0.97,
                         6 * lr, "value of " + cpu.params.params()[i].name);
}

// A bf16 step copies between the GPU and the host as often as the CPU test counts
// (tests/model/host_transfers_test.cc): token ids and targets up together, the losses and
// routing sums down, the aux-loss gradients up; none per layer, dropless, with a capacity
// or with GShard's random second expert.
TEST(GpuHostTransfersTest, Bf16StepCopiesFourTimes) {
  for (const Case& c :
       {Case{"TOP_K", 0.0f, DType::kBF16}, Case{"TOP_K", 0.75f, DType::kBF16},
        Case{"GSHARD_TOP2", 0.0f, DType::kBF16}}) {
    SCOPED_TRACE(c.gating + " capacity " + std::to_string(c.capacity_factor));
    const config::Recipe recipe = step_recipe(c);
    CudaDevice gpu_dev(0);
    Replica gpu(recipe, gpu_dev, DType::kBF16);
    Tensor ids = Tensor::empty({3, 19}, DType::kI32);
    Tensor targets = Tensor::empty({3, 19}, DType::kI32);
    Rng data(5);
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(97));
      targets.data<int32_t>()[i] = static_cast<int32_t>(data.below(97));
    }
    Rng routing(1);
    for (int step = 1; step <= 2; ++step) {  // the first also makes the rotary table
      const int64_t before = gpu_dev.host_transfers();
      gpu.model.forward(gpu_dev, ids, targets, true, routing);
      gpu.model.backward(gpu_dev, 1.0f);
      if (step == 2) {
        EXPECT_EQ(gpu_dev.host_transfers() - before, 4);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Gating, TrainStepTest,
                         ::testing::Values(Case{"TOP_K", 0.0f},
                                           Case{"TOP_K renormalize: false", 0.0f},
                                           Case{"GSHARD_TOP2", 0.0f}, Case{"TOP_K", 1.0f},
                                           Case{"TOP_K", 0.0f, DType::kBF16},
                                           Case{"GSHARD_TOP2", 0.0f, DType::kBF16}));

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::testing::run_gpu_tests(argc, argv); }
