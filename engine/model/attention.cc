#include "engine/model/attention.h"

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "moe/tensor_parallel_sum.h"

namespace switchyard {

namespace {
Tensor activation(Device& dev, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}
}  // namespace

Attention::Attention(ParamStore& params, const std::string& prefix,
                     const config::ModelConfig& model, Communicator* tensor_parallel)
    : tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr),
      heads_(model.num_heads()),
      kv_heads_(model.num_kv_heads()),
      head_dim_(model.head_dim()),
      norm_eps_(model.norm_eps()) {
  const int64_t hidden = model.hidden_size();
  const float std = model.init_std();
  const ShardSpec column{.tensor_parallel_dim = 0};
  wq_ = &params.add(prefix + "q_proj.weight", {heads_ * head_dim_, hidden}, column,
                   ParamInit::kNormal, std);
  wk_ = &params.add(prefix + "k_proj.weight", {kv_heads_ * head_dim_, hidden}, column,
                   ParamInit::kNormal, std);
  wv_ = &params.add(prefix + "v_proj.weight", {kv_heads_ * head_dim_, hidden}, column,
                   ParamInit::kNormal, std);
  wo_ = &params.add(prefix + "o_proj.weight", {hidden, heads_ * head_dim_},
                   ShardSpec{.tensor_parallel_dim = 1}, ParamInit::kNormal, std);
  if (model.attention_bias()) {
    q_bias_ = &params.add(prefix + "q_proj.bias", {heads_ * head_dim_}, column, ParamInit::kZeros);
    k_bias_ = &params.add(prefix + "k_proj.bias", {kv_heads_ * head_dim_}, column, ParamInit::kZeros);
    v_bias_ = &params.add(prefix + "v_proj.bias", {kv_heads_ * head_dim_}, column, ParamInit::kZeros);
  }
  heads_ = wq_->shape[0] / head_dim_;
  kv_heads_ = wk_->shape[0] / head_dim_;
  if (model.qk_norm()) {
    // Normalises the whole projection, so it cannot be split over tensor-parallel ranks
    // without a reduction (make_layout refuses that combination).
    SY_CHECK_MSG(tp_ == nullptr, "q/k norm with tensor parallelism");
    q_norm_ = &params.add(prefix + "q_norm.weight", {heads_ * head_dim_}, ShardSpec{}, ParamInit::kOnes);
    k_norm_ = &params.add(prefix + "k_norm.weight", {kv_heads_ * head_dim_}, ShardSpec{}, ParamInit::kOnes);
  }
}

Tensor Attention::project(Device& dev, const Tensor& x, Param* weight, Param* bias, Param* norm,
                          Tensor* pre_norm, Tensor* rstd) {
  const int64_t n = x.rows();
  Tensor out = activation(dev, {n, weight->shape[0]}, x.dtype());
  matmul(dev, x, false, weight->work, true, out);
  if (bias) add_bias_(dev, out, bias->value);
  if (!norm) return out;
  *pre_norm = out;
  *rstd = activation(dev, {n}, DType::kF32);
  Tensor normed = activation(dev, {n, weight->shape[0]}, x.dtype());
  rmsnorm_forward(dev, out, norm->value, norm_eps_, normed, *rstd);
  return normed;
}

Tensor Attention::forward(Device& dev, const Tensor& x, int64_t batch, int64_t seq,
                          const Tensor& rope) {
  batch_ = batch;
  seq_ = seq;
  x_ = x;
  q_ = project(dev, x, wq_, q_bias_, q_norm_, &q_pre_norm_, &q_rstd_)
           .reshape({batch, seq, heads_, head_dim_});
  k_ = project(dev, x, wk_, k_bias_, k_norm_, &k_pre_norm_, &k_rstd_)
           .reshape({batch, seq, kv_heads_, head_dim_});
  v_ = project(dev, x, wv_, v_bias_, nullptr, nullptr, nullptr)
           .reshape({batch, seq, kv_heads_, head_dim_});
  rope_forward(dev, rope, q_);
  rope_forward(dev, rope, k_);
  Tensor out4 = activation(dev, {batch, seq, heads_, head_dim_}, x.dtype());
  lse_ = activation(dev, {batch, heads_, seq}, DType::kF32);
  attention_forward(dev, q_, k_, v_, out4, lse_);
  attn_out_ = out4.reshape({batch * seq, heads_ * head_dim_});
  Tensor y = activation(dev, {batch * seq, wo_->shape[0]}, x.dtype());
  matmul(dev, attn_out_, false, wo_->work, true, y);
  if (tp_) tensor_parallel_sum(dev, *tp_, y);
  return y;
}

void Attention::project_backward(Device& dev, Tensor& dproj, Param* weight, Param* bias,
                                 Param* norm, const Tensor& pre_norm, const Tensor& rstd,
                                 Tensor& dx) {
  Tensor d = dproj;
  if (norm) {
    d = activation(dev, dproj.shape(), dproj.dtype());
    rmsnorm_backward(dev, dproj, pre_norm, norm->value, rstd, d, norm->grad);
  }
  if (bias) bias_backward(dev, d, bias->grad);
  matmul(dev, d, true, x_, false, weight->grad, 1.0f, 1.0f);
  matmul(dev, d, false, weight->work, false, dx, 1.0f, 1.0f);
}

Tensor Attention::backward(Device& dev, const Tensor& dy, const Tensor& rope) {
  const int64_t n = dy.rows();
  const DType dtype = dy.dtype();
  matmul(dev, dy, true, attn_out_, false, wo_->grad, 1.0f, 1.0f);
  Tensor dattn = activation(dev, {batch_, seq_, heads_, head_dim_}, dtype);
  Tensor dattn2 = dattn.reshape({n, heads_ * head_dim_});
  matmul(dev, dy, false, wo_->work, false, dattn2);
  Tensor dq = activation(dev, q_.shape(), dtype);
  Tensor dk = activation(dev, k_.shape(), dtype);
  Tensor dv = activation(dev, v_.shape(), dtype);
  attention_backward(dev, dattn, q_, k_, v_, attn_out_.reshape({batch_, seq_, heads_, head_dim_}),
                     lse_, dq, dk, dv);
  rope_backward(dev, rope, dq);
  rope_backward(dev, rope, dk);

  Tensor dx = Tensor::zeros({n, x_.row_size()}, dtype, MemoryKind::kActivations, dev);
  Tensor dq2 = dq.reshape({n, heads_ * head_dim_});
  Tensor dk2 = dk.reshape({n, kv_heads_ * head_dim_});
  Tensor dv2 = dv.reshape({n, kv_heads_ * head_dim_});
  project_backward(dev, dq2, wq_, q_bias_, q_norm_, q_pre_norm_, q_rstd_, dx);
  project_backward(dev, dk2, wk_, k_bias_, k_norm_, k_pre_norm_, k_rstd_, dx);
  project_backward(dev, dv2, wv_, v_bias_, nullptr, Tensor(), Tensor(), dx);
  if (tp_) tensor_parallel_sum(dev, *tp_, dx);
  x_ = q_ = k_ = v_ = q_pre_norm_ = k_pre_norm_ = q_rstd_ = k_rstd_ = lse_ = attn_out_ = Tensor();
  return dx;
}

}  // namespace switchyard
