// Gradients summed exactly under runtime.batch_invariant (docs/determinism.md).
//
// Every micro-batch's gradient of a trainable parameter goes into the parameter's ledger
// (Param::ledger, kernels/exact_grad.h) as soon as backward finishes its unit, and the
// gradient is zeroed; under expert parallelism an expert's gradient goes in one part per
// source rank (MoeLayer), a part being one global micro-batch's tokens. After the step's
// last micro-batch, finish() adds the ledgers over the data-parallel replicas
// (expert-data-parallel ones for experts) as integers and reads each into its gradient
// (the owned rows under ZeRO-2/3). Every gradient is then the exact sum of the global
// micro-batches' gradients rounded once: the same bits however the micro-batches are
// spread over data- and expert-parallel ranks, ZeRO stages and pipeline stages.
//
// It replaces the overlapped reductions (OverlappedGradReduce, ZeroShards' reduce-scatter):
// nothing is reduced while backward runs, and the ledgers take 16 bytes a gradient element.
#pragma once

#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/param_store.h"
#include "engine/optim/zero.h"

namespace switchyard {

class ExactGrads final : public ParamHooks {
 public:
  // `zero`: the ZeRO-2/3 shards whose values it gathers (acquire, release) and whose
  // gradient rows finish() fills, or null. Construct after params.allocate().
  ExactGrads(ParamStore& params, Device& dev, Communicator& dense_replicas,
             Communicator& expert_replicas, ZeroShards* zero);

  void acquire(int unit) override;
  void release(int unit) override;
  void begin_grads(int unit) override;
  void end_grads(int unit) override;

  // The step's gradients from the ledgers, which start the next step empty (collective).
  void finish();

 private:
  ParamStore& params_;
  Device& dev_;
  Communicator& dense_replicas_;
  Communicator& expert_replicas_;
  ZeroShards* zero_;
  std::vector<std::vector<Param*>> units_;  // each unit's trainable parameters
  Tensor dense_ledger_, expert_ledger_;     // every ledger, as views of these
};

}  // namespace switchyard
