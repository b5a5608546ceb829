#include "moe/swiglu_ffn.h"

#include <utility>

#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "moe/tensor_parallel_sum.h"

namespace switchyard {

SwigluFfn::SwigluFfn(ParamStore& params, const std::string& prefix, int64_t hidden,
                     int64_t ffn_hidden, float init_std, Communicator* tensor_parallel)
    : tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr) {
  gate_up_ = &params.add(prefix + "gate_up_proj.weight", {2, ffn_hidden, hidden},
                         ShardSpec{.tensor_parallel_dim = 1}, ParamInit::kNormal, init_std);
  down_ = &params.add(prefix + "down_proj.weight", {hidden, ffn_hidden},
                      ShardSpec{.tensor_parallel_dim = 1}, ParamInit::kNormal, init_std);
}

Tensor SwigluFfn::forward(Device& dev, const Tensor& x) {
  const int64_t n = x.rows();
  const int64_t ffn = down_->shape[1];
  saved_.x = x;
  saved_.gate_up_out = Tensor::empty({n, 2 * ffn}, x.dtype(), MemoryKind::kActivations, dev);
  matmul(dev, x, false, gate_up_->work, true, saved_.gate_up_out);
  saved_.act = Tensor::empty({n, ffn}, x.dtype(), MemoryKind::kActivations, dev);
  swiglu_forward(dev, saved_.gate_up_out, saved_.act);
  Tensor y = Tensor::empty({n, down_->shape[0]}, x.dtype(), MemoryKind::kActivations, dev);
  matmul(dev, saved_.act, false, down_->work, true, y);
  if (tp_) tensor_parallel_sum(dev, *tp_, y);
  return y;
}

Tensor SwigluFfn::backward(Device& dev, const Tensor& dy) {
  const int64_t n = dy.rows();
  const int64_t ffn = down_->shape[1];
  matmul(dev, dy, true, saved_.act, false, down_->grad, 1.0f, 1.0f);
  Tensor dact = Tensor::empty({n, ffn}, dy.dtype(), MemoryKind::kActivations, dev);
  matmul(dev, dy, false, down_->work, false, dact);
  Tensor dgate_up = Tensor::empty({n, 2 * ffn}, dy.dtype(), MemoryKind::kActivations, dev);
  swiglu_backward(dev, dact, saved_.gate_up_out, dgate_up);
  matmul(dev, dgate_up, true, saved_.x, false, gate_up_->grad, 1.0f, 1.0f);
  Tensor dx = Tensor::empty({n, saved_.x.row_size()}, dy.dtype(), MemoryKind::kActivations, dev);
  matmul(dev, dgate_up, false, gate_up_->work, false, dx);
  if (tp_) tensor_parallel_sum(dev, *tp_, dx);
  discard();
  return dx;
}

void SwigluFfn::discard() { saved_ = {}; }

SwigluFfn::Saved SwigluFfn::stash() { return std::exchange(saved_, {}); }

void SwigluFfn::restore(Saved&& saved) { saved_ = std::move(saved); }

}  // namespace switchyard
