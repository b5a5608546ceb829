// Document-aware attention through the whole model (data.document_attention): a packed
// window of documents gives each document the logits it gets alone (positions restart,
// no attention across), and the backward matches finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "engine/model/transformer.h"
#include "tests/finite_differences.h"

namespace switchyard {
namespace {

constexpr int64_t kVocab = 64;
constexpr int64_t kSeq = 12;
// Document lengths of the two windows; the last may run on past the window.
const std::vector<std::vector<int64_t>> kLengths = {{5, 1, 6}, {3, 20}};

config::Recipe tiny_recipe() {
  auto recipe = config::parse_recipe(R"(
    name: "document-attention"
    model { vocab_size: 64 hidden_size: 16 num_layers: 2 num_heads: 4 num_kv_heads: 2
            rope_theta: 100 norm_eps: 1e-5 ffn_hidden_size: 24 first_dense_layers: 1
            qk_norm: true init_std: 0.3 }
    moe { num_experts: 4 top_k: 2 gating: TOP_K aux_loss_coef: 0.1 z_loss_coef: 0.01
          expert_ffn_hidden_size: 12 }
    optimizer { lr: 1e-3 }
    train { global_batch_size: 2 seq_len: 12 steps: 1 }
    data { document_attention: true }
  )", "document-attention");
  SY_CHECK(recipe.ok());
  return *recipe;
}

Tensor doc_starts() {
  Tensor t = Tensor::empty({2, kSeq}, DType::kI32);
  for (int64_t b = 0; b < 2; ++b) {
    int64_t begin = 0;
    size_t doc = 0;
    for (int64_t i = 0; i < kSeq; ++i) {
      if (i == begin + kLengths[b][doc]) begin += kLengths[b][doc++];
      t.data<int32_t>()[b * kSeq + i] = static_cast<int32_t>(begin);
    }
  }
  return t;
}

struct Model {
  ParamStore params;
  Transformer model;
  Model() : model(tiny_recipe(), params) {
    params.allocate(cpu_device());
    params.initialize(7);
  }
};

Tensor ids_of(int64_t batch, int64_t seq, uint64_t seed) {
  Tensor ids = Tensor::empty({batch, seq}, DType::kI32);
  Rng rng(seed);
  for (int64_t i = 0; i < ids.numel(); ++i)
    ids.data<int32_t>()[i] = static_cast<int32_t>(rng.below(kVocab));
  return ids;
}

TEST(DocumentAttentionModelTest, EachDocumentGetsTheLogitsItGetsAlone) {
  Model m;
  const Tensor ids = ids_of(2, kSeq, 3), targets = ids_of(2, kSeq, 4);
  Rng rng(0);
  Tensor packed;
  m.model.forward(cpu_device(), ids, targets, /*training=*/false, rng, &packed, doc_starts());
  const Tensor packed_host = packed.on_host();
  const Tensor starts = doc_starts();
  int documents = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t begin = 0; begin < kSeq;) {
      int64_t end = begin + 1;
      while (end < kSeq && starts.data<int32_t>()[b * kSeq + end] == begin) ++end;
      const int64_t len = end - begin;
      Tensor alone_ids = Tensor::empty({1, len}, DType::kI32);
      std::copy_n(ids.data<int32_t>() + b * kSeq + begin, len, alone_ids.data<int32_t>());
      const Tensor alone = m.model.logits(cpu_device(), alone_ids);
      for (int64_t i = 0; i < len * kVocab; ++i)
        ASSERT_NEAR(packed_host.data<float>()[(b * kSeq + begin) * kVocab + i],
                    alone.data<float>()[i], 1e-5)
            << "window " << b << " document at " << begin << " entry " << i;
      ++documents;
      begin = end;
    }
  }
  EXPECT_EQ(documents, 5);
  // Without documents the later positions do see the earlier documents.
  Tensor plain;
  m.model.forward(cpu_device(), ids, targets, /*training=*/false, rng, &plain);
  EXPECT_NE(plain.on_host().data<float>()[5 * kVocab], packed_host.data<float>()[5 * kVocab]);
}

TEST(DocumentAttentionModelTest, BackwardMatchesFiniteDifferences) {
  Model m;
  const Tensor ids = ids_of(2, kSeq, 5), targets = ids_of(2, kSeq, 6);
  const Tensor starts = doc_starts();
  auto forward = [&] {
    Rng rng(0);
    return m.model.forward(cpu_device(), ids, targets, /*training=*/false, rng, nullptr, starts);
  };
  forward();
  m.model.backward(cpu_device(), 1.0f);
  const double eps = 1e-3;
  for (Param& p : m.params.params()) {
    const auto g = testing::directional_derivative(p, eps, [&] { return forward().total; });
    EXPECT_NEAR(g.analytic, g.numeric, 5e-3 * std::max(1.0, std::abs(g.numeric))) << p.name;
    EXPECT_NE(g.analytic, 0.0) << p.name;
  }
}

}  // namespace
}  // namespace switchyard
