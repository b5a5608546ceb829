// How often a training step copies between its device and the host: on a GPU each copy
// waits for the work queued before it, so a step must make few of them, and with
// dropless routing no more for a deeper model. The model runs on a CPU device object
// of its own (not the host's), so that its copies to and from the host go through the
// counted Device interface as a GPU's do.
#include <gtest/gtest.h>

#include <string>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"

namespace switchyard {
namespace {

constexpr int64_t kBatch = 2, kSeq = 16, kVocab = 64;

config::Recipe recipe_with(int layers, const std::string& moe) {
  const std::string text = R"(
    name: "host-transfers"
    model { vocab_size: 64 hidden_size: 16 num_layers: )" +
                           std::to_string(layers) + R"( num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 ffn_hidden_size: 24 init_std: 0.3 }
    moe { num_experts: 4 top_k: 2 aux_loss_coef: 0.01 z_loss_coef: 0.001
          expert_ffn_hidden_size: 12 )" +
                           moe + R"( }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 2 seq_len: 16 steps: 1 }
  )";
  auto recipe = config::parse_recipe(text, "host-transfers");
  SY_CHECK(recipe.ok());
  return *recipe;
}

struct Step {
  int64_t transfers = 0;
  double loss = 0;
};

// The second of two training steps (the first makes the rotary table) on `dev`.
Step second_step(const config::Recipe& recipe, Device& dev) {
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(dev, DType::kF32);
  params.initialize(7);
  refresh_working_copies(dev, params);
  Tensor ids = Tensor::empty({kBatch, kSeq}, DType::kI32);
  Tensor targets = Tensor::empty({kBatch, kSeq}, DType::kI32);
  Rng data(4);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(kVocab));
    targets.data<int32_t>()[i] = static_cast<int32_t>(data.below(kVocab));
  }
  Rng rng(1);
  model.forward(dev, ids, targets, /*training=*/true, rng);
  model.backward(dev, 1.0f);
  Step step;
  const int64_t before = dev.host_transfers();
  step.loss = model.forward(dev, ids, targets, /*training=*/true, rng).total;
  model.backward(dev, 1.0f);
  step.transfers = dev.host_transfers() - before;
  return step;
}

// Up: token ids and targets, together; down: the losses, then every layer's routing sums;
// up: every layer's aux-loss gradient. Dropless, with a capacity that drops, and with
// GShard's random second expert: the plan's counts stay on the device in each.
TEST(HostTransfersTest, StepCopiesFourTimesWhateverItsDepth) {
  for (const std::string moe : {"", "capacity_factor: 0.75", "gating: GSHARD_TOP2"}) {
    SCOPED_TRACE(moe);
    CpuDevice two_layers_dev, four_layers_dev;
    const Step two = second_step(recipe_with(2, moe), two_layers_dev);
    const Step four = second_step(recipe_with(4, moe), four_layers_dev);
    EXPECT_EQ(two.transfers, 4);
    EXPECT_EQ(four.transfers, 4);
    // The same step on the host's own device.
    EXPECT_EQ(four.loss, second_step(recipe_with(4, moe), cpu_device()).loss);
  }
}

}  // namespace
}  // namespace switchyard
