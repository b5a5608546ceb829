#include "engine/optim/muon.h"

#include <string>

#include "absl/strings/match.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/tensor_shards.h"

namespace switchyard {
namespace {

// The parameters that hold token rows (AdamW trains them, as the published Muon does).
constexpr const char* kEmbeddingNameParts[] = {"embed_tokens.", "lm_head."};
// Experts' fused gate and up rows: two matrices per expert.
constexpr char kFusedGateUpSuffix[] = "experts.gate_up_proj";

}  // namespace

bool trained_by_muon(const config::OptimizerConfig& opt, const Param& p) {
  if (opt.algorithm() != config::MUON || p.whole_shape.size() < 2) return false;
  const size_t rank = p.whole_shape.size();
  if (p.whole_shape[rank - 1] < 2 || p.whole_shape[rank - 2] < 2) return false;
  if (absl::StrContains(p.name, kRouterNamePart)) return false;
  for (const char* part : kEmbeddingNameParts)
    if (absl::StrContains(p.name, part)) return false;
  return true;
}

MuonMatrix muon_matrix(const Param& p) {
  const size_t rank = p.whole_shape.size();
  MuonMatrix m{p.whole_shape[rank - 2], p.whole_shape[rank - 1]};
  if (absl::EndsWith(p.name, kFusedGateUpSuffix)) m.rows /= 2;
  return m;
}

NewtonSchulz newton_schulz(const config::MuonConfig& muon) {
  return NewtonSchulz{muon.ns_steps(), muon.ns_a(), muon.ns_b(), muon.ns_c(), muon.eps()};
}

void orthogonalize_shard(Device& dev, const config::MuonConfig& muon, const Param& p,
                         Communicator* tensor_parallel, Tensor& input) {
  const MuonMatrix m = muon_matrix(p);
  const bool split = !p.spec.expert && p.shape != p.whole_shape;
  if (!split) {
    muon_orthogonalize(dev, newton_schulz(muon), input, m.rows, m.cols);
    return;
  }
  const int dim = p.spec.tensor_parallel_dim;
  Tensor whole = gather_shards(*tensor_parallel, input, dim).to(dev);
  muon_orthogonalize(dev, newton_schulz(muon), whole, m.rows, m.cols);
  copy_shard(whole, dim, tensor_parallel->rank(), tensor_parallel->size(), input);
}

void apply_muon_update(Device& dev, const config::OptimizerConfig& opt, const Param& p, double lr,
                       Tensor& value, const Tensor& update, Tensor* work) {
  const MuonMatrix m = muon_matrix(p);
  const double scale = muon_update_scale(opt.muon().update_rms(), m.rows, m.cols);
  muon_apply(dev, lr, p.weight_decay ? opt.weight_decay() : 0.0, scale, value, update, work);
}

}  // namespace switchyard
