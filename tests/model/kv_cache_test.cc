// Generation with the KV cache against recomputing the whole prefix for every token:
// the same greedy tokens and the same logits up to summation order, for a Mixtral-like
// model at a capacity factor (generation routes dropless either way), for one with
// q/k norms, attention biases, shared experts and a dense first layer, and for a
// Qwen3-MoE-like one (per-head q/k norms, attention wider than the hidden size).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"

namespace switchyard {
namespace {

constexpr int64_t kVocab = 96;
constexpr int kPromptTokens = 5;
constexpr int kNewTokens = 48;

config::Recipe recipe_from(const std::string& model, const std::string& moe) {
  const std::string text = R"(
    name: "kv-cache"
    model { vocab_size: 96 hidden_size: 32 num_layers: 3 num_heads: 4 num_kv_heads: 2
            rope_theta: 10000 norm_eps: 1e-5 init_std: 0.3 )" +
                           model + R"( }
    moe { num_experts: 4 top_k: 2 expert_ffn_hidden_size: 24 )" +
                           moe + R"( }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 1 seq_len: 64 steps: 1 }
  )";
  auto recipe = config::parse_recipe(text, "kv-cache");
  SY_CHECK(recipe.ok());
  return *recipe;
}

int32_t argmax(const float* logits) {
  return static_cast<int32_t>(std::max_element(logits, logits + kVocab) - logits);
}

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // before each new token
};

Generation with_cache(Transformer& model, const std::vector<int32_t>& prompt) {
  DecodeCache cache = model.start_decoding(kPromptTokens + kNewTokens);
  Generation g;
  Tensor logits = model.decode(cpu_device(), prompt, cache);
  for (int i = 0; i < kNewTokens; ++i) {
    const float* row = logits.data<float>();
    g.logits.emplace_back(row, row + kVocab);
    g.tokens.push_back(argmax(row));
    logits = model.decode(cpu_device(), {g.tokens.back()}, cache);
  }
  return g;
}

Generation recomputing(Transformer& model, const std::vector<int32_t>& prompt) {
  std::vector<int32_t> ids = prompt;
  Generation g;
  for (int i = 0; i < kNewTokens; ++i) {
    const int64_t len = static_cast<int64_t>(ids.size());
    Tensor in = Tensor::empty({1, len}, DType::kI32);
    std::copy(ids.begin(), ids.end(), in.data<int32_t>());
    const Tensor logits = model.logits(cpu_device(), in);
    const float* row = logits.data<float>() + (len - 1) * kVocab;
    g.logits.emplace_back(row, row + kVocab);
    g.tokens.push_back(argmax(row));
    ids.push_back(g.tokens.back());
  }
  return g;
}

class KvCacheTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(KvCacheTest, GreedyTokensEqualRecomputingThePrefix) {
  const config::Recipe recipe = recipe_from(GetParam().first, GetParam().second);
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(5);
  refresh_working_copies(cpu_device(), params);
  const std::vector<int32_t> prompt = {3, 17, 42, 8, 77};

  const Generation cached = with_cache(model, prompt);
  const Generation full = recomputing(model, prompt);
  EXPECT_EQ(cached.tokens, full.tokens);
  for (int i = 0; i < kNewTokens; ++i)
    for (int64_t v = 0; v < kVocab; ++v)
      ASSERT_NEAR(cached.logits[i][v], full.logits[i][v], 1e-4) << "token " << i << " id " << v;
  // A model that repeats one token would hide a cache that ignores the past.
  std::vector<int32_t> sorted = cached.tokens;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvCacheTest,
    ::testing::Values(
        std::make_pair(std::string("tie_embeddings: false"), std::string("capacity_factor: 1.0")),
        std::make_pair(std::string("qk_norm: true attention_bias: true first_dense_layers: 1 "
                                   "ffn_hidden_size: 40 tie_embeddings: true"),
                       std::string("gating: TOP_K renormalize: false num_shared_experts: 1 "
                                   "shared_expert_ffn_hidden_size: 20 "
                                   "shared_expert_gate: true")),
        std::make_pair(std::string("qk_head_norm: true head_dim: 12 first_dense_layers: 1 "
                                   "ffn_hidden_size: 40"),
                       std::string("gating: TOP_K"))));

}  // namespace
}  // namespace switchyard
