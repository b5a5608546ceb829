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
    cq_ = project(dev, x, *wq_a_);
    cq_rstd_ = activation(dev, {n}, DType::kF32);
    cq_normed_ = activation(dev, cq_.shape(), dtype);
    rmsnorm_forward(dev, cq_, q_norm_->value, eps_, cq_normed_, cq_rstd_);
    q = project(dev, cq_normed_, *wq_b_);
  }
  const Tensor q_heads = q.reshape({n * heads_, qk_});
  Tensor q_rot = activation(dev, {batch, seq, heads_, rope_}, dtype);
  copy_columns(dev, q_heads, nope_, q_rot, 0, rope_);
  Tensor q_rot_rows = rope_view(q_rot, doc_starts_.defined());
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
  c_ = activation(dev, {n, kv_rank_}, dtype);
  copy_columns(dev, latent, 0, c_, 0, kv_rank_);
  c_rstd_ = activation(dev, {n}, DType::kF32);
  c_normed_ = activation(dev, c_.shape(), dtype);
  rmsnorm_forward(dev, c_, kv_norm_->value, eps_, c_normed_, c_rstd_);
  Tensor k_rot = activation(dev, {batch, seq, 1, rope_}, dtype);
  copy_columns(dev, latent, kv_rank_, k_rot, 0, rope_);
  Tensor k_rot_rows = rope_view(k_rot, doc_starts_.defined());
  rope_forward(dev, rope, k_rot_rows);
  return k_rot.reshape({n, rope_});
}

void LatentAttention::key_value_heads(Device& dev, const Tensor& c_normed, const Tensor& k_rot,
                                      int64_t batch, int64_t seq) {
  const int64_t n = batch * seq;
  const DType dtype = c_normed.dtype();
  const Tensor kv = project(dev, c_normed, *wkv_b_).reshape({n * heads_, nope_ + v_dim_});
  const Shape full = {batch, seq, heads_, width_};
  k_full_ = width_ > qk_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  v_full_ = width_ > v_dim_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  copy_columns(dev, kv, 0, k_full_, 0, nope_);
  Tensor k_rows = k_full_.reshape({n, heads_ * width_});
  for (int64_t h = 0; h < heads_; ++h)
    copy_columns(dev, k_rot, 0, k_rows, h * width_ + nope_, rope_);
  copy_columns(dev, kv, nope_, v_full_, 0, v_dim_);
}

Tensor LatentAttention::forward(Device& dev, const Tensor& x, int64_t batch, int64_t seq,
                                const Tensor& rope, const Tensor& doc_starts) {
  batch_ = batch;
  seq_ = seq;
  x_ = x;
  doc_starts_ = doc_starts;
  q_full_ = query_heads(dev, x, batch, seq, rope);
  const Tensor k_rot = key_latent(dev, x, batch, seq, rope);
  key_value_heads(dev, c_normed_, k_rot, batch, seq);
  core_forward(dev);
  Tensor y = project(dev, attn_out_, *wo_);
  if (recompute_core_) out_full_ = lse_ = attn_out_ = Tensor();
  if (tp_) tensor_parallel_sum(dev, *tp_, y);
  return y;
}

void LatentAttention::core_forward(Device& dev) {
  const int64_t n = batch_ * seq_;
  const DType dtype = q_full_.dtype();
  out_full_ = activation(dev, q_full_.shape(), dtype);
  lse_ = activation(dev, {batch_, heads_, seq_}, DType::kF32);
  attention_forward(dev, q_full_, k_full_, v_full_, out_full_, lse_, doc_starts_);
  attn_out_ = activation(dev, {n, heads_ * v_dim_}, dtype);
  Tensor attn_heads = attn_out_.reshape({n * heads_, v_dim_});
  copy_columns(dev, out_full_, 0, attn_heads, 0, v_dim_);
}

void LatentAttention::query_backward(Device& dev, const Tensor& dq, Tensor& latent_grad,
                                     Tensor& dx) {
  if (wq_) {
    project_backward(dev, dq, x_, *wq_, dx, 0.0f);
    if (tp_) tensor_parallel_sum(dev, *tp_, dx);
    return;
  }
  Tensor dcq_normed = activation(dev, cq_normed_.shape(), dq.dtype());
  project_backward(dev, dq, cq_normed_, *wq_b_, dcq_normed, 0.0f);
  copy_columns(dev, dcq_normed, 0, latent_grad, 0, q_rank_);
}

void LatentAttention::latent_backward(Device& dev, const Tensor& latent_grad, Tensor& dx) {
  const int64_t n = latent_grad.rows();
  const DType dtype = latent_grad.dtype();
  if (wq_a_) {
    Tensor dnormed = activation(dev, {n, q_rank_}, dtype);
    copy_columns(dev, latent_grad, 0, dnormed, 0, q_rank_);
    Tensor dcq = activation(dev, {n, q_rank_}, dtype);
    rmsnorm_backward(dev, dnormed, cq_, q_norm_->value, cq_rstd_, dcq, q_norm_->grad);
    project_backward(dev, dcq, x_, *wq_a_, dx, 0.0f);
  }
  Tensor dnormed = activation(dev, {n, kv_rank_}, dtype);
  copy_columns(dev, latent_grad, q_rank_, dnormed, 0, kv_rank_);
  Tensor dc = activation(dev, {n, kv_rank_}, dtype);
  rmsnorm_backward(dev, dnormed, c_, kv_norm_->value, c_rstd_, dc, kv_norm_->grad);
  Tensor dlatent = activation(dev, {n, kv_rank_ + rope_}, dtype);
  copy_columns(dev, dc, 0, dlatent, 0, kv_rank_);
  copy_columns(dev, latent_grad, q_rank_ + kv_rank_, dlatent, kv_rank_, rope_);
  project_backward(dev, dlatent, x_, *wkv_a_, dx, 1.0f);
}

Tensor LatentAttention::backward(Device& dev, const Tensor& dy, const Tensor& rope) {
  const int64_t n = dy.rows();
  const DType dtype = dy.dtype();
  if (recompute_core_) core_forward(dev);
  Tensor dattn = activation(dev, {n, heads_ * v_dim_}, dtype);
  project_backward(dev, dy, attn_out_, *wo_, dattn, 0.0f);
  const Shape full = q_full_.shape();
  Tensor dout = width_ > v_dim_ ? zeroed(dev, full, dtype) : activation(dev, full, dtype);
  copy_columns(dev, dattn.reshape({n * heads_, v_dim_}), 0, dout, 0, v_dim_);
  Tensor dq_full = activation(dev, full, dtype);
  Tensor dk_full = activation(dev, full, dtype);
  Tensor dv_full = activation(dev, full, dtype);
  attention_backward(dev, dout, q_full_, k_full_, v_full_, out_full_, lse_, dq_full, dk_full,
                     dv_full, doc_starts_);
  scale_(dev, dq_full, q_scale_);

  // Queries: the position-free channels as they are, the rotary ones rotated back.
  Tensor dq = activation(dev, {n, heads_ * qk_}, dtype);
  Tensor dq_heads = dq.reshape({n * heads_, qk_});
  copy_columns(dev, dq_full, 0, dq_heads, 0, nope_);
  Tensor dq_rot = activation(dev, {batch_, seq_, heads_, rope_}, dtype);
  copy_columns(dev, dq_full, nope_, dq_rot, 0, rope_);
  Tensor dq_rot_rows = rope_view(dq_rot, doc_starts_.defined());
  rope_backward(dev, rope, dq_rot_rows);
  copy_columns(dev, dq_rot, 0, dq_heads, nope_, rope_);

  // Keys and values: kv_b_proj's output gradient; the shared rotary key sums its heads.
  Tensor dkv = activation(dev, {n, heads_ * (nope_ + v_dim_)}, dtype);
  Tensor dkv_heads = dkv.reshape({n * heads_, nope_ + v_dim_});
  copy_columns(dev, dk_full, 0, dkv_heads, 0, nope_);
  copy_columns(dev, dv_full, 0, dkv_heads, nope_, v_dim_);
  Tensor dk_rot = zeroed(dev, {batch_, seq_, 1, rope_}, dtype);
  Tensor dk_rot_rows = dk_rot.reshape({n, rope_});
  const Tensor dk_rows = dk_full.reshape({n, heads_ * width_});
  for (int64_t h = 0; h < heads_; ++h)
    add_columns(dev, dk_rows, h * width_ + nope_, dk_rot_rows, 0, rope_);
  Tensor dk_rot_view = rope_view(dk_rot, doc_starts_.defined());
  rope_backward(dev, rope, dk_rot_view);

  // One buffer of the latents' gradients: [query latent | key/value latent | rotary key].
  Tensor latent_grad = activation(dev, {n, q_rank_ + kv_rank_ + rope_}, dtype);
  Tensor dx = activation(dev, {n, x_.row_size()}, dtype);
  query_backward(dev, dq, latent_grad, dx);
  Tensor dc_normed = activation(dev, {n, kv_rank_}, dtype);
  project_backward(dev, dkv, c_normed_, *wkv_b_, dc_normed, 0.0f);
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
  doc_starts_ = Tensor();
  const Tensor rope_rows = rope.slice_rows(past, positions);
  const Tensor q_full = query_heads(dev, x, 1, n, rope_rows);
  cache.v.slice_rows(past, positions).copy_from(key_latent(dev, x, 1, n, rope_rows));
  cache.k.slice_rows(past, positions).copy_from(c_normed_);
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

void LatentAttention::discard() {
  x_ = cq_ = cq_rstd_ = cq_normed_ = c_ = c_rstd_ = c_normed_ = Tensor();
  q_full_ = k_full_ = v_full_ = out_full_ = lse_ = attn_out_ = doc_starts_ = Tensor();
}

LatentAttention::Saved LatentAttention::stash() {
  Saved s;
  s.batch = std::exchange(batch_, 0);
  s.seq = std::exchange(seq_, 0);
  s.x = std::exchange(x_, Tensor());
  s.cq = std::exchange(cq_, Tensor());
  s.cq_rstd = std::exchange(cq_rstd_, Tensor());
  s.cq_normed = std::exchange(cq_normed_, Tensor());
  s.c = std::exchange(c_, Tensor());
  s.c_rstd = std::exchange(c_rstd_, Tensor());
  s.c_normed = std::exchange(c_normed_, Tensor());
  s.q_full = std::exchange(q_full_, Tensor());
  s.k_full = std::exchange(k_full_, Tensor());
  s.v_full = std::exchange(v_full_, Tensor());
  s.out_full = std::exchange(out_full_, Tensor());
  s.lse = std::exchange(lse_, Tensor());
  s.attn_out = std::exchange(attn_out_, Tensor());
  s.doc_starts = std::exchange(doc_starts_, Tensor());
  return s;
}

void LatentAttention::restore(Saved&& s) {
  batch_ = s.batch;
  seq_ = s.seq;
  x_ = std::move(s.x);
  cq_ = std::move(s.cq);
  cq_rstd_ = std::move(s.cq_rstd);
  cq_normed_ = std::move(s.cq_normed);
  c_ = std::move(s.c);
  c_rstd_ = std::move(s.c_rstd);
  c_normed_ = std::move(s.c_normed);
  q_full_ = std::move(s.q_full);
  k_full_ = std::move(s.k_full);
  v_full_ = std::move(s.v_full);
  out_full_ = std::move(s.out_full);
  lse_ = std::move(s.lse);
  attn_out_ = std::move(s.attn_out);
  doc_starts_ = std::move(s.doc_starts);
}

}  // namespace switchyard
