// Multi-head latent attention (engine/model/mla.h): one layer against a naive double
// implementation of its definition; the whole model's gradients against finite
// differences with a query latent and without, with values narrower and wider than the
// query/key heads, selective recomputation, sigmoid group-limited routing, shared experts
// and a dense first layer, with documents (data.document_attention) and without; and
// generation with the latent KV cache against recomputing the prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "engine/model/attention.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "tests/finite_differences.h"

namespace switchyard {
namespace {

constexpr int64_t kVocab = 64;

config::Recipe recipe_with(const std::string& mla, const std::string& extra = "") {
  const std::string text = R"(
    name: "mla"
    model { vocab_size: 64 hidden_size: 16 num_layers: 2 num_heads: 4 rope_theta: 10000
            norm_eps: 1e-5 ffn_hidden_size: 24 first_dense_layers: 1 init_std: 0.3
            mla { )" + mla + R"( } }
    moe { num_experts: 8 top_k: 2 gating: TOP_K score_function: SIGMOID num_groups: 4 top_groups: 2
          renormalize: true routed_scaling_factor: 2.5 expert_ffn_hidden_size: 12
          num_shared_experts: 1 shared_expert_ffn_hidden_size: 8 z_loss_coef: 0.01 }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 2 seq_len: 7 steps: 1 )" + extra + R"( }
  )";
  auto recipe = config::parse_recipe(text, "mla");
  SY_CHECK_MSG(recipe.ok(), "the test recipe is valid");
  return *recipe;
}

const std::string kWithQueryLatent =
    "q_lora_rank: 12 kv_lora_rank: 10 qk_nope_head_dim: 6 qk_rope_head_dim: 4 v_head_dim: 8";
const std::string kWideValues =
    "kv_lora_rank: 10 qk_nope_head_dim: 4 qk_rope_head_dim: 2 v_head_dim: 8";

// Norm gains away from one, so that a misplaced norm shows.
void perturb_norms(ParamStore& params) {
  Rng perturb(5);
  for (Param& p : params.params())
    if (p.init == ParamInit::kOnes)
      for (int64_t i = 0; i < p.value.numel(); ++i)
        p.value.data<float>()[i] += static_cast<float>(0.2 * perturb.normal());
}

std::vector<double> values(ParamStore& params, const std::string& name) {
  const Param* p = params.find(name);
  SY_CHECK_MSG(p, "the parameter exists");
  return std::vector<double>(p->value.data<float>(), p->value.data<float>() + p->value.numel());
}

// y (rows, out) = x (rows, in) w^T, w (out, in).
std::vector<double> linear(const std::vector<double>& x, const std::vector<double>& w,
                           int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(rows * out, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[r * out + o] += x[r * in + i] * w[o * in + i];
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& g,
                            int64_t rows, int64_t n, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[r * n + i] * x[r * n + i];
    const double rstd = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * rstd * g[i];
  }
  return y;
}

// Rotates the `d` channels at v[0..d) of position p ("rotate half", theta 10000).
void rotate(double* v, int64_t d, int64_t p) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = p * std::pow(10000.0, -2.0 * i / d);
    const double a = v[i], b = v[i + half];
    v[i] = a * std::cos(angle) - b * std::sin(angle);
    v[i + half] = b * std::cos(angle) + a * std::sin(angle);
  }
}

// The layer's output for one sequence x (seq, hidden), from its definition.
std::vector<double> reference_layer(ParamStore& params, const std::string& prefix,
                                    const config::ModelConfig& m, const std::vector<double>& x,
                                    int64_t seq) {
  const auto& mla = m.mla();
  const int64_t H = m.hidden_size(), heads = m.num_heads(), nope = mla.qk_nope_head_dim(),
                rope = mla.qk_rope_head_dim(), vd = mla.v_head_dim(), qk = nope + rope,
                qr = mla.q_lora_rank(), kr = mla.kv_lora_rank();
  std::vector<double> q;
  if (qr > 0) {
    const auto cq = linear(x, values(params, prefix + "q_a_proj.weight"), seq, H, qr);
    const auto normed = rmsnorm(cq, values(params, prefix + "q_a_layernorm.weight"), seq, qr, 1e-6);
    q = linear(normed, values(params, prefix + "q_b_proj.weight"), seq, qr, heads * qk);
  } else {
    q = linear(x, values(params, prefix + "q_proj.weight"), seq, H, heads * qk);
  }
  auto latent = linear(x, values(params, prefix + "kv_a_proj_with_mqa.weight"), seq, H, kr + rope);
  std::vector<double> c(seq * kr);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < kr; ++i) c[t * kr + i] = latent[t * (kr + rope) + i];
  const auto cn = rmsnorm(c, values(params, prefix + "kv_a_layernorm.weight"), seq, kr, 1e-6);
  const auto kv = linear(cn, values(params, prefix + "kv_b_proj.weight"), seq, kr, heads * (nope + vd));
  for (int64_t t = 0; t < seq; ++t) {
    rotate(&latent[t * (kr + rope) + kr], rope, t);
    for (int64_t h = 0; h < heads; ++h) rotate(&q[(t * heads + h) * qk + nope], rope, t);
  }
  std::vector<double> attn(seq * heads * vd, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < seq; ++i) {
      std::vector<double> s(i + 1);
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < nope; ++d)
          dot += q[(i * heads + h) * qk + d] * kv[(j * heads + h) * (nope + vd) + d];
        for (int64_t d = 0; d < rope; ++d)
          dot += q[(i * heads + h) * qk + nope + d] * latent[j * (kr + rope) + kr + d];
        s[j] = dot * scale;
      }
      const double top = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - top));
      for (int64_t j = 0; j <= i; ++j)
        for (int64_t d = 0; d < vd; ++d)
          attn[(i * heads + h) * vd + d] += s[j] / sum * kv[(j * heads + h) * (nope + vd) + nope + d];
    }
  return linear(attn, values(params, prefix + "o_proj.weight"), seq, heads * vd, H);
}

class MlaLayerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaLayerTest, ForwardMatchesTheDefinition) {
  const config::Recipe recipe = recipe_with(GetParam());
  ParamStore params;
  Attention attention(params, "a.", recipe.model());
  params.allocate(cpu_device());
  params.initialize(3);
  perturb_norms(params);
  const int64_t batch = 2, seq = 9, H = recipe.model().hidden_size();
  Tensor x = Tensor::empty({batch * seq, H});
  Rng data(7);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(data.normal());
  const Tensor rope = rope_table_for(recipe.model(), seq);
  const Tensor y = attention.forward(cpu_device(), x, batch, seq, rope);
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x.data<float>() + b * seq * H;
    const auto expected =
        reference_layer(params, "a.", recipe.model(), std::vector<double>(xb, xb + seq * H), seq);
    for (int64_t i = 0; i < seq * H; ++i)
      ASSERT_NEAR(y.data<float>()[b * seq * H + i], expected[i], 1e-4 * (1 + std::abs(expected[i])))
          << "batch " << b << " element " << i;
  }
}

// With document starts each document gets the output it gets alone: its positions
// restart at 0 and it attends to nothing before its start.
TEST_P(MlaLayerTest, DocumentsMatchTheDefinitionRunOnEachDocument) {
  const config::Recipe recipe = recipe_with(GetParam());
  ParamStore params;
  Attention attention(params, "a.", recipe.model());
  params.allocate(cpu_device());
  params.initialize(4);
  perturb_norms(params);
  const int64_t batch = 2, seq = 9, H = recipe.model().hidden_size();
  const std::vector<std::vector<int64_t>> lengths = {{4, 1, 4}, {2, 7}};
  Tensor starts = Tensor::empty({batch, seq}, DType::kI32);
  for (int64_t b = 0, i = 0; b < batch; ++b) {
    int64_t begin = 0;
    for (const int64_t len : lengths[b]) {
      for (int64_t t = 0; t < len; ++t, ++i) starts.data<int32_t>()[i] = static_cast<int32_t>(begin);
      begin += len;
    }
  }
  Tensor x = Tensor::empty({batch * seq, H});
  Rng data(8);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(data.normal());
  const Tensor rope = document_rope_table(rope_table_for(recipe.model(), seq), starts);
  const Tensor y = attention.forward(cpu_device(), x, batch, seq, rope, starts);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t begin = 0;
    for (const int64_t len : lengths[b]) {
      const float* xd = x.data<float>() + (b * seq + begin) * H;
      const auto expected = reference_layer(params, "a.", recipe.model(),
                                            std::vector<double>(xd, xd + len * H), len);
      for (int64_t i = 0; i < len * H; ++i)
        ASSERT_NEAR(y.data<float>()[(b * seq + begin) * H + i], expected[i],
                    1e-4 * (1 + std::abs(expected[i])))
            << "batch " << b << " document at " << begin << " element " << i;
      begin += len;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaLayerTest,
                         ::testing::Values(kWithQueryLatent, kWideValues));

struct GradCase {
  std::string mla;
  std::string train;
  bool documents = false;  // windows of several documents (data.document_attention)
};

class MlaGradTest : public ::testing::TestWithParam<GradCase> {};

TEST_P(MlaGradTest, BackwardMatchesFiniteDifferences) {
  const config::Recipe recipe = recipe_with(GetParam().mla, GetParam().train);
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(11);
  perturb_norms(params);
  Tensor ids = Tensor::empty({2, 7}, DType::kI32), targets = Tensor::empty({2, 7}, DType::kI32);
  Rng data(3);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>(data.below(kVocab));
    targets.data<int32_t>()[i] = i % 7 == 6 ? -1 : static_cast<int32_t>(data.below(kVocab));
  }
  // Documents of 2, 1 and 4 tokens in the first window, 3 and 4 in the second.
  Tensor starts;
  if (GetParam().documents) {
    starts = Tensor::empty({2, 7}, DType::kI32);
    const int32_t values[14] = {0, 0, 2, 3, 3, 3, 3, 0, 0, 0, 3, 3, 3, 3};
    std::copy(values, values + 14, starts.data<int32_t>());
  }
  auto loss = [&]() {
    Rng rng(0);
    return model.forward(cpu_device(), ids, targets, false, rng, nullptr, starts).total;
  };
  loss();
  model.backward(cpu_device(), 1.0f);
  const double eps = 1e-3;
  int checked = 0;
  for (Param& p : params.params()) {
    if (!p.trainable) continue;
    const auto g = testing::directional_derivative(p, eps, loss);
    EXPECT_NEAR(g.analytic, g.numeric, 5e-3 * std::max(1.0, std::abs(g.numeric))) << p.name;
    EXPECT_NE(g.analytic, 0.0) << p.name;
    checked += p.name.find("self_attn.") != std::string::npos;
  }
  // Every latent-attention parameter of both layers was checked.
  const bool query_latent = recipe.model().mla().q_lora_rank() > 0;
  EXPECT_EQ(checked, 2 * (query_latent ? 7 : 5));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaGradTest,
                         ::testing::Values(GradCase{kWithQueryLatent, ""},
                                           GradCase{kWideValues, ""},
                                           GradCase{kWithQueryLatent, "recompute: SELECTIVE"},
                                           GradCase{kWithQueryLatent, "", true},
                                           GradCase{kWideValues, "recompute: SELECTIVE", true}));

TEST(MlaDecode, CachedGenerationEqualsRecomputingThePrefix) {
  const config::Recipe recipe = recipe_with(kWithQueryLatent);
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  params.initialize(5);
  refresh_working_copies(cpu_device(), params);
  std::vector<int32_t> ids = {3, 17, 42, 8, 33};
  DecodeCache cache = model.start_decoding(24);
  // Each layer caches the latent (10) and the rotary key (4) per position, not the
  // heads' padded keys and values (2 x 4 heads x 10).
  EXPECT_EQ(model.decode_cache_bytes(24), 2.0 * 24 * (10 + 4) * sizeof(float));
  EXPECT_EQ(model.decode_cache_bytes(24),
            static_cast<double>((cache.layers[0].k.nbytes() + cache.layers[0].v.nbytes()) *
                                cache.layers.size()));
  Tensor cached = model.decode(cpu_device(), ids, cache);
  for (int step = 0; step < 12; ++step) {
    const int64_t len = static_cast<int64_t>(ids.size());
    Tensor in = Tensor::empty({1, len}, DType::kI32);
    std::copy(ids.begin(), ids.end(), in.data<int32_t>());
    const Tensor full = model.logits(cpu_device(), in);
    for (int64_t v = 0; v < kVocab; ++v)
      ASSERT_NEAR(cached.data<float>()[v], full.data<float>()[(len - 1) * kVocab + v], 1e-4)
          << "step " << step;
    const int32_t next = static_cast<int32_t>(
        std::max_element(cached.data<float>(), cached.data<float>() + kVocab) - cached.data<float>());
    ids.push_back(next);
    cached = model.decode(cpu_device(), {next}, cache);
  }
}

}  // namespace
}  // namespace switchyard
