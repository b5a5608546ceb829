// Dense SwiGLU feed-forward block: down(silu(gate x) * up x). Serves the dense layers
// and the always-on shared experts. The gate and up projections are one fused
// parameter of shape (2, ffn, hidden): one GEMM computes both, and the
// tensor-parallel split of dimension 1 keeps each rank's gate and up rows together.
// With a tensor-parallel group, gate/up are column-parallel and down row-parallel
// (Megatron): each rank computes ffn / tp of the hidden units and the partial outputs,
// and in backward the partial input gradients, are summed over the group.
#pragma once

#include <string>

#include "core/comm/communicator.h"
#include "core/runtime/param_store.h"
#include "core/runtime/tensor.h"

namespace switchyard {

class SwigluFfn {
 public:
  SwigluFfn(ParamStore& params, const std::string& prefix, int64_t hidden, int64_t ffn_hidden,
            float init_std, Communicator* tensor_parallel = nullptr);
  // x: (n, hidden) -> (n, hidden). Saves what backward needs.
  Tensor forward(Device& dev, const Tensor& x);
  // dy: (n, hidden) -> dx (n, hidden); parameter gradients accumulate.
  Tensor backward(Device& dev, const Tensor& dy);
  // Drops what forward saved for backward.
  void discard();
  // Everything forward saved for backward, the module's one record of it.
  struct Saved {
    Tensor x;            // (n, hidden)
    Tensor gate_up_out;  // (n, 2 * ffn_hidden)
    Tensor act;          // (n, ffn_hidden)
  };
  // The record moved out of the module (left as after discard()) and back, so that
  // several micro-batches can wait for their backward (pipeline schedules).
  Saved stash();
  void restore(Saved&& saved);

 private:
  Communicator* tp_;  // null or of size 1: no reduction
  Param* gate_up_;  // (2, ffn_hidden, hidden)
  Param* down_;     // (hidden, ffn_hidden)
  Saved saved_;
};

}  // namespace switchyard
