// Which parameters optimizer.algorithm MUON trains with Muon, and the matrices it sees in
// them (engine/optim/muon.h).
#include "engine/optim/muon.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace switchyard {
namespace {

config::OptimizerConfig with_algorithm(config::OptimizerAlgorithm algorithm) {
  config::OptimizerConfig opt;
  opt.set_algorithm(algorithm);
  return opt;
}

TEST(MuonParams, HiddenMatricesOnly) {
  ParamStore params;
  const int64_t hidden = 16, vocab = 64, experts = 4, ffn = 8;
  params.add("model.embed_tokens.weight", {vocab, hidden}, ShardSpec{}, ParamInit::kNormal);
  params.add("lm_head.weight", {vocab, hidden}, ShardSpec{}, ParamInit::kNormal);
  params.add("model.layers.0.mlp.gate.weight", {experts, hidden}, ShardSpec{}, ParamInit::kNormal);
  params.add("model.layers.0.mlp.shared_expert_gate.weight", {1, hidden}, ShardSpec{},
             ParamInit::kNormal);
  params.add("model.layers.0.input_layernorm.weight", {hidden}, ShardSpec{}, ParamInit::kOnes);
  params.add("model.layers.0.self_attn.q_proj.bias", {hidden}, ShardSpec{}, ParamInit::kZeros);
  params.add("model.layers.0.self_attn.q_proj.weight", {hidden, hidden}, ShardSpec{},
             ParamInit::kNormal);
  params.add("model.layers.0.mlp.experts.gate_up_proj", {experts, 2 * ffn, hidden},
             ShardSpec{.expert = true}, ParamInit::kNormal);
  params.add("model.layers.0.mlp.experts.down_proj", {experts, hidden, ffn},
             ShardSpec{.expert = true}, ParamInit::kNormal);
  params.add("model.layers.0.mlp.shared_expert.gate_up_proj.weight", {2, ffn, hidden},
             ShardSpec{}, ParamInit::kNormal);
  const config::OptimizerConfig muon = with_algorithm(config::MUON);
  const config::OptimizerConfig adamw = with_algorithm(config::ADAMW);
  std::vector<std::string> trained;
  for (const Param& p : params.params()) {
    if (trained_by_muon(muon, p)) trained.push_back(p.name);
    EXPECT_FALSE(trained_by_muon(adamw, p)) << p.name;
  }
  EXPECT_EQ(trained, (std::vector<std::string>{
                         "model.layers.0.self_attn.q_proj.weight",
                         "model.layers.0.mlp.experts.gate_up_proj",
                         "model.layers.0.mlp.experts.down_proj",
                         "model.layers.0.mlp.shared_expert.gate_up_proj.weight"}));
  // Each expert's gate and up are matrices of their own, as are a dense FFN's.
  const MuonMatrix gate_up = muon_matrix(*params.find("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(gate_up.rows, ffn);
  EXPECT_EQ(gate_up.cols, hidden);
  const MuonMatrix down = muon_matrix(*params.find("model.layers.0.mlp.experts.down_proj"));
  EXPECT_EQ(down.rows, hidden);
  EXPECT_EQ(down.cols, ffn);
  const MuonMatrix dense =
      muon_matrix(*params.find("model.layers.0.mlp.shared_expert.gate_up_proj.weight"));
  EXPECT_EQ(dense.rows, ffn);
  EXPECT_EQ(dense.cols, hidden);
}

}  // namespace
}  // namespace switchyard
