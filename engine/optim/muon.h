// Which parameters Muon trains under optimizer.algorithm MUON, the matrices it sees in
// them, and its orthogonalised update of a rank's tensor-parallel shard. The optimizer
// (engine/optim/optimizer.h) and ZeRO's row shards (engine/optim/zero.h) run the momentum
// and the update on the parts they hold; the orthogonalisation always takes whole
// matrices (kernels/muon.h).
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/param_store.h"
#include "kernels/muon.h"

namespace switchyard {

// Whether optimizer.algorithm MUON trains `p` with Muon: a hidden weight matrix (rank 2
// or more, its last two dimensions each above 1), not the embedding, the head or the
// router. AdamW trains the rest.
bool trained_by_muon(const config::OptimizerConfig& opt, const Param& p);

// The shape of each matrix Muon orthogonalises in p's whole value: its last two
// dimensions, the leading ones indexing matrices of their own (experts; a dense FFN's gate
// and up). An expert tensor of fused gate and up rows (experts.gate_up_proj: each
// expert's gate rows, then its up rows) holds two matrices per expert.
struct MuonMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
};
MuonMatrix muon_matrix(const Param& p);

// optimizer.muon's iteration (defaults filled in).
NewtonSchulz newton_schulz(const config::MuonConfig& muon);

// Replaces `input` (this rank's tensor-parallel shard of p, p.shape: the momentum's output)
// with the orthogonalised update of that shard: where tensor parallelism splits p, the
// shards are gathered whole over `tensor_parallel` (a collective; every rank of the group
// orthogonalises the same whole matrices) and this rank's is cut back out.
void orthogonalize_shard(Device& dev, const config::MuonConfig& muon, const Param& p,
                         Communicator* tensor_parallel, Tensor& input);

// Applies the orthogonalised `update` to `value` (rows of p's shard, as are update and
// work): decoupled weight decay where p decays, and the step lr * update_rms * sqrt(max(
// rows, cols)) of p's matrices.
void apply_muon_update(Device& dev, const config::OptimizerConfig& opt, const Param& p, double lr,
                       Tensor& value, const Tensor& update, Tensor* work);

}  // namespace switchyard
