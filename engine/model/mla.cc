#include "engine/model/mla.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/model/attention.h"
#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "moe/tensor_parallel_sum.h"

namespace switchyard {

namespace {
// The latents' RMSNorm epsilon, DeepSeek's whatever model.norm_eps is (transformers builds
// q_a_layernorm and kv_a_layernorm with their default, 1e-6).
constexpr float kLatentNormEps = 1e-6f;

Tensor activation(Device& dev, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, MemoryKind::kActivations, dev);
}
Tensor zeroed(Device& dev, const Shape& shape, DType dtype) {
  return Tensor::zeros(shape, dtype, MemoryKind::kActivations, dev);
}
// y = x w^T into a new (rows of x, rows of w) activation.
Tensor project(Device& dev, const Tensor& x, const Param& w) {
  Tensor y = activation(dev, {x.rows(), w.shape[0]}, x.dtype());
  matmul(dev, x, false, w.work, true, y);
  return y;
}
// Backward of project(): w.grad += dy^T x, dx (+)= dy w.
void project_backward(Device& dev, const Tensor& dy, const Tensor& x, Param& w, Tensor& dx,
                      float dx_beta) {
  matmul(dev, dy, true, x, false, w.grad, 1.0f, 1.0f);
  matmul(dev, dy, false, w.work, false, dx, 1.0f, dx_beta);
}
}  // namespace

float mla_softmax_scale(const config::ModelConfig& model) {
  const int64_t qk = model.mla().qk_nope_head_dim() + model.mla().qk_rope_head_dim();
  const config::RopeScaling& scaling = model.rope_scaling();
  const double mscale = scaling.type() == config::YARN && scaling.mscale_all_dim() != 0
                            ? yarn_mscale(scaling.factor(), scaling.mscale_all_dim())
                            : 1.0;
  return static_cast<float>(mscale * mscale) / std::sqrt(static_cast<float>(qk));
}

LatentAttention::LatentAttention(ParamStore& params, const std::string& prefix,
                                 const config::ModelConfig& model, Communicator* tensor_parallel)
    : tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr),
      nope_(model.mla().qk_nope_head_dim()),
      rope_(model.mla().qk_rope_head_dim()),
      v_dim_(model.mla().v_head_dim()),
      qk_(nope_ + rope_),
      width_(std::max(qk_, v_dim_)),
      q_rank_(model.mla().q_lora_rank()),
      kv_rank_(model.mla().kv_lora_rank()),
      eps_(kLatentNormEps),
      q_scale_(std::sqrt(static_cast<float>(width_)) * mla_softmax_scale(model)) {
  const int64_t hidden = model.hidden_size(), heads = model.num_heads();
  const float std = model.init_std();
  const ShardSpec column{.tensor_parallel_dim = 0};
  if (q_rank_ > 0) {
    wq_a_ = &params.add(prefix + "q_a_proj.weight", {q_rank_, hidden}, ShardSpec{},
                        ParamInit::kNormal, std);
    q_norm_ = &params.add(prefix + "q_a_layernorm.weight", {q_rank_}, ShardSpec{}, ParamInit::kOnes);
    wq_b_ = &params.add(prefix + "q_b_proj.weight", {heads * qk_, q_rank_}, column,
                        ParamInit::kNormal, std);
  } else {
    wq_ = &params.add(prefix + "q_proj.weight", {heads * qk_, hidden}, column, ParamInit::kNormal,
                      std);
  }
  wkv_a_ = &params.add(prefix + "kv_a_proj_with_mqa.weight", {kv_rank_ + rope_, hidden},
                       ShardSpec{}, ParamInit::kNormal, std);
  kv_norm_ = &params.add(prefix + "kv_a_layernorm.weight", {kv_rank_}, ShardSpec{}, ParamInit::kOnes);
  wkv_b_ = &params.add(prefix + "kv_b_proj.weight", {heads * (nope_ + v_dim_), kv_rank_}, column,
                       ParamInit::kNormal, std);
  wo_ = &params.add(prefix + "o_proj.weight", {hidden, heads * v_dim_},
                    ShardSpec{.tensor_parallel_dim = 1}, ParamInit::kNormal, std);
  heads_ = wkv_b_->shape[0] / (nope_ + v_dim_);
}

Tensor LatentAttention::query_heads(Device& dev, const Tensor& x, int64_t batch, int64_t seq,
                                    const Tensor& rope) {
  const int64_t n = batch * seq;
  const DType dtype = x.dtype();
  Tensor q;  // (n, heads * qk)
  if (wq_) {
    q = project(dev, x, *wq_);
  } else {
    saved_.cq = project(dev, x, *wq_a_);
    saved_.cq_rstd = activation(dev, {n}, DType::kF32);
    saved_.cq_normed = activation(dev, saved_.cq.shape(), dtype);
    rmsnorm_forward(dev, saved_.cq, q_norm_->value, eps_, saved_.cq_normed, saved_.cq_rstd);
    q = project(dev, saved_.cq_normed, *wq_b_);
  }
  const Tensor q_heads = q.reshape({n * heads_, qk_});
  Tensor q_rot = activation(dev, {batch, seq, heads_, rope_}, dtype);
  copy_columns(dev, q_heads, nope_, q_rot, 0, rope_);
  Tensor q_rot_rows = rope_view(q_rot, saved_.doc_starts.defined());
  rope_forward(dev, rope, q_rot_rows);
  const Shape full = {batch, seq, heads_, width_};
  Tensor q_full = width_ > qk_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  copy_columns(dev, q_heads, 0, q_full, 0, nope_);
  copy_columns(dev, q_rot, 0, q_full, nope_, rope_);
  scale_(dev, q_full, q_scale_);
  return q_full;
}

Tensor LatentAttention::key_latent(Device& dev, const Tensor& x, int64_t batch, int64_t seq,
                                   const Tensor& rope) {
  const int64_t n = batch * seq;
  const DType dtype = x.dtype();
  const Tensor latent = project(dev, x, *wkv_a_);  // (n, kv_rank + rope)
  saved_.c = activation(dev, {n, kv_rank_}, dtype);
  copy_columns(dev, latent, 0, saved_.c, 0, kv_rank_);
  saved_.c_rstd = activation(dev, {n}, DType::kF32);
  saved_.c_normed = activation(dev, saved_.c.shape(), dtype);
  rmsnorm_forward(dev, saved_.c, kv_norm_->value, eps_, saved_.c_normed, saved_.c_rstd);
  Tensor k_rot = activation(dev, {batch, seq, 1, rope_}, dtype);
  copy_columns(dev, latent, kv_rank_, k_rot, 0, rope_);
  Tensor k_rot_rows = rope_view(k_rot, saved_.doc_starts.defined());
  rope_forward(dev, rope, k_rot_rows);
  return k_rot.reshape({n, rope_});
}

void LatentAttention::key_value_heads(Device& dev, const Tensor& c_normed, const Tensor& k_rot,
                                      int64_t batch, int64_t seq) {
  const int64_t n = batch * seq;
  const DType dtype = c_normed.dtype();
  const Tensor kv = project(dev, c_normed, *wkv_b_).reshape({n * heads_, nope_ + v_dim_});
  const Shape full = {batch, seq, heads_, width_};
  saved_.k_full = width_ > qk_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  saved_.v_full = width_ > v_dim_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  copy_columns(dev, kv, 0, saved_.k_full, 0, nope_);
  Tensor k_rows = saved_.k_full.reshape({n, heads_ * width_});
  for (int64_t h = 0; h < heads_; ++h)
    copy_columns(dev, k_rot, 0, k_rows, h * width_ + nope_, rope_);
  copy_columns(dev, kv, nope_, saved_.v_full, 0, v_dim_);
}

Tensor LatentAttention::forward(Device& dev, const Tensor& x, int64_t batch, int64_t seq,
                                const Tensor& rope, const Tensor& doc_starts) {
  saved_.batch = batch;
  saved_.seq = seq;
  saved_.x = x;
  saved_.doc_starts = doc_starts;
  saved_.q_full = query_heads(dev, x, batch, seq, rope);
  const Tensor k_rot = key_latent(dev, x, batch, seq, rope);
  key_value_heads(dev, saved_.c_normed, k_rot, batch, seq);
  core_forward(dev);
  Tensor y = project(dev, saved_.attn_out, *wo_);
  if (recompute_core_) saved_.out_full = saved_.lse = saved_.attn_out = Tensor();
  if (tp_) tensor_parallel_sum(dev, *tp_, y);
  return y;
}

void LatentAttention::core_forward(Device& dev) {
  const int64_t n = saved_.batch * saved_.seq;
  const DType dtype = saved_.q_full.dtype();
  saved_.out_full = activation(dev, saved_.q_full.shape(), dtype);
  saved_.lse = activation(dev, {saved_.batch, heads_, saved_.seq}, DType::kF32);
  attention_forward(dev, saved_.q_full, saved_.k_full, saved_.v_full, saved_.out_full,
                    saved_.lse, saved_.doc_starts);
  saved_.attn_out = activation(dev, {n, heads_ * v_dim_}, dtype);
  Tensor attn_heads = saved_.attn_out.reshape({n * heads_, v_dim_});
  copy_columns(dev, saved_.out_full, 0, attn_heads, 0, v_dim_);
}

void LatentAttention::query_backward(Device& dev, const Tensor& dq, Tensor& latent_grad,
                                     Tensor& dx) {
  if (wq_) {
    project_backward(dev, dq, saved_.x, *wq_, dx, 0.0f);
    if (tp_) tensor_parallel_sum(dev, *tp_, dx);
    return;
  }
  Tensor dcq_normed = activation(dev, saved_.cq_normed.shape(), dq.dtype());
  project_backward(dev, dq, saved_.cq_normed, *wq_b_, dcq_normed, 0.0f);
  copy_columns(dev, dcq_normed, 0, latent_grad, 0, q_rank_);
}

void LatentAttention::latent_backward(Device& dev, const Tensor& latent_grad, Tensor& dx) {
  const int64_t n = latent_grad.rows();
  const DType dtype = latent_grad.dtype();
  if (wq_a_) {
    Tensor dnormed = activation(dev, {n, q_rank_}, dtype);
    copy_columns(dev, latent_grad, 0, dnormed, 0, q_rank_);
    Tensor dcq = activation(dev, {n, q_rank_}, dtype);
    rmsnorm_backward(dev, dnormed, saved_.cq, q_norm_->value, saved_.cq_rstd, dcq,
                     q_norm_->grad);
    project_backward(dev, dcq, saved_.x, *wq_a_, dx, 0.0f);
  }
  Tensor dnormed = activation(dev, {n, kv_rank_}, dtype);
  copy_columns(dev, latent_grad, q_rank_, dnormed, 0, kv_rank_);
  Tensor dc = activation(dev, {n, kv_rank_}, dtype);
  rmsnorm_backward(dev, dnormed, saved_.c, kv_norm_->value, saved_.c_rstd, dc, kv_norm_->grad);
  Tensor dlatent = activation(dev, {n, kv_rank_ + rope_}, dtype);
  copy_columns(dev, dc, 0, dlatent, 0, kv_rank_);
  copy_columns(dev, latent_grad, q_rank_ + kv_rank_, dlatent, kv_rank_, rope_);
  project_backward(dev, dlatent, saved_.x, *wkv_a_, dx, 1.0f);
}

Tensor LatentAttention::backward(Device& dev, const Tensor& dy, const Tensor& rope) {
  const int64_t n = dy.rows();
  const DType dtype = dy.dtype();
  if (recompute_core_) core_forward(dev);
  Tensor dattn = activation(dev, {n, heads_ * v_dim_}, dtype);
  project_backward(dev, dy, saved_.attn_out, *wo_, dattn, 0.0f);
  const Shape full = saved_.q_full.shape();
  Tensor dout = width_ > v_dim_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  copy_columns(dev, dattn.reshape({n * heads_, v_dim_}), 0, dout, 0, v_dim_);
  Tensor dq_full = activation(dev, full, dtype);
  Tensor dk_full = activation(dev, full, dtype);
  Tensor dv_full = activation(dev, full, dtype);
  attention_backward(dev, dout, saved_.q_full, saved_.k_full, saved_.v_full, saved_.out_full,
                     saved_.lse, dq_full, dk_full, dv_full, saved_.doc_starts);
  scale_(dev, dq_full, q_scale_);

  // Queries: the position-free channels as they are, the rotary ones rotated back.
  Tensor dq = activation(dev, {n, heads_ * qk_}, dtype);
  Tensor dq_heads = dq.reshape({n * heads_, qk_});
  copy_columns(dev, dq_full, 0, dq_heads, 0, nope_);
  Tensor dq_rot = activation(dev, {saved_.batch, saved_.seq, heads_, rope_}, dtype);
  copy_columns(dev, dq_full, nope_, dq_rot, 0, rope_);
  Tensor dq_rot_rows = rope_view(dq_rot, saved_.doc_starts.defined());
  rope_backward(dev, rope, dq_rot_rows);
  copy_columns(dev, dq_rot, 0, dq_heads, nope_, rope_);

  // Keys and values: kv_b_proj's output gradient; the shared rotary key sums its heads.
  Tensor dkv = activation(dev, {n, heads_ * (nope_ + v_dim_)}, dtype);
  Tensor dkv_heads = dkv.reshape({n * heads_, nope_ + v_dim_});
  copy_columns(dev, dk_full, 0, dkv_heads, 0, nope_);
  copy_columns(dev, dv_full, 0, dkv_heads, nope_, v_dim_);
  Tensor dk_rot = zeroed(dev, {saved_.batch, saved_.seq, 1, rope_}, dtype);
  Tensor dk_rot_rows = dk_rot.reshape({n, rope_});
  const Tensor dk_rows = dk_full.reshape({n, heads_ * width_});
  for (int64_t h = 0; h < heads_; ++h)
    add_columns(dev, dk_rows, h * width_ + nope_, dk_rot_rows, 0, rope_);
  Tensor dk_rot_view = rope_view(dk_rot, saved_.doc_starts.defined());
  rope_backward(dev, rope, dk_rot_view);

  // One buffer of the latents' gradients: [query latent | key/value latent | rotary key].
  Tensor latent_grad = activation(dev, {n, q_rank_ + kv_rank_ + rope_}, dtype);
  Tensor dx = activation(dev, {n, saved_.x.row_size()}, dtype);
  query_backward(dev, dq, latent_grad, dx);
  Tensor dc_normed = activation(dev, {n, kv_rank_}, dtype);
  project_backward(dev, dkv, saved_.c_normed, *wkv_b_, dc_normed, 0.0f);
  copy_columns(dev, dc_normed, 0, latent_grad, q_rank_, kv_rank_);
  copy_columns(dev, dk_rot_rows, 0, latent_grad, q_rank_ + kv_rank_, rope_);
  if (tp_) tensor_parallel_sum(dev, *tp_, latent_grad);
  latent_backward(dev, latent_grad, dx);
  discard();
  return dx;
}

KvCache LatentAttention::empty_cache(int64_t positions) const {
  return {Tensor::zeros({positions, kv_rank_}), Tensor::zeros({positions, rope_})};
}

Tensor LatentAttention::decode(Device& dev, const Tensor& x, int64_t past, const Tensor& rope,
                               KvCache& cache) {
  SY_CHECK_MSG(!dev.is_cuda() && x.dtype() == DType::kF32 && !tp_,
               "attention decode runs on the CPU in f32 on one rank");
  const int64_t n = x.rows(), positions = past + n;
  SY_CHECK_MSG(past >= 0 && positions <= cache.k.dim(0), "attention decode: the cache is full");
  saved_.doc_starts = Tensor();
  const Tensor rope_rows = rope.slice_rows(past, positions);
  const Tensor q_full = query_heads(dev, x, 1, n, rope_rows);
  cache.v.slice_rows(past, positions).copy_from(key_latent(dev, x, 1, n, rope_rows));
  cache.k.slice_rows(past, positions).copy_from(saved_.c_normed);
  const Tensor attn = attend_latent(dev, q_full.reshape({n, heads_ * width_}), cache, past);
  discard();
  return project(dev, attn, *wo_);
}

Tensor LatentAttention::attend_latent(Device& dev, const Tensor& q_rows, const KvCache& cache,
                                      int64_t past) {
  const int64_t n = q_rows.rows(), positions = past + n, latent = kv_rank_ + rope_;
  const int64_t block = nope_ + v_dim_;  // one head's rows of kv_b_proj: key, then value
  const Tensor& w = wkv_b_->work;
  // Every position's key in latent space, [c, k_rot], one key head shared by the heads.
  Tensor keys = activation(dev, {positions, 1, latent}, DType::kF32);
  copy_columns(dev, cache.k.slice_rows(0, positions), 0, keys, 0, kv_rank_);
  copy_columns(dev, cache.v.slice_rows(0, positions), 0, keys, kv_rank_, rope_);
  // Each head's query: its position-free part through the head's key up-projection
  // (q_nope W_k . c = q_nope . W_k c), its rotary part as it is.
  Tensor queries = activation(dev, {n, heads_, latent}, DType::kF32);
  Tensor query_rows = queries.reshape({n, heads_ * latent});
  Tensor q_nope = activation(dev, {n, nope_}, DType::kF32);
  Tensor q_latent = activation(dev, {n, kv_rank_}, DType::kF32);
  for (int64_t h = 0; h < heads_; ++h) {
    copy_columns(dev, q_rows, h * width_, q_nope, 0, nope_);
    matmul(dev, q_nope, false, w.slice_rows(h * block, h * block + nope_), false, q_latent);
    copy_columns(dev, q_latent, 0, query_rows, h * latent, kv_rank_);
    copy_columns(dev, q_rows, h * width_ + nope_, query_rows, h * latent + kv_rank_, rope_);
  }
  // q_rows carry sqrt(D) x the softmax scale; attend_cached divides by sqrt(latent).
  scale_(dev, queries, std::sqrt(static_cast<float>(latent) / static_cast<float>(width_)));
  Tensor mixed = activation(dev, {n, heads_, latent}, DType::kF32);
  attend_cached(queries, keys, keys, past, mixed);
  // Each head's softmax-weighted latent through its value up-projection.
  const Tensor mixed_rows = mixed.reshape({n, heads_ * latent});
  Tensor attn = activation(dev, {n, heads_ * v_dim_}, DType::kF32);
  Tensor mixed_latent = activation(dev, {n, kv_rank_}, DType::kF32);
  Tensor value = activation(dev, {n, v_dim_}, DType::kF32);
  for (int64_t h = 0; h < heads_; ++h) {
    copy_columns(dev, mixed_rows, h * latent, mixed_latent, 0, kv_rank_);
    matmul(dev, mixed_latent, false, w.slice_rows(h * block + nope_, (h + 1) * block), true, value);
    copy_columns(dev, value, 0, attn, h * v_dim_, v_dim_);
  }
  return attn;
}

void LatentAttention::discard() { saved_ = {}; }

LatentAttention::Saved LatentAttention::stash() { return std::exchange(saved_, {}); }

void LatentAttention::restore(Saved&& saved) { saved_ = std::move(saved); }

}  // namespace switchyard
