#include "engine/model/attention.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "engine/parallel/tensor_shards.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
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

void attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, int64_t past, Tensor& out) {
  const int64_t n = q.dim(0), heads = q.dim(1), D = q.dim(2), kv_heads = k.dim(1);
  const int64_t ld_q = heads * D, ld_kv = kv_heads * D, group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t block = cpu::kAttentionBlock;
  std::vector<float> p_buffer(static_cast<size_t>(std::min(n, block) * (past + n)));
  float* p = p_buffer.data();
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q.data<float>() + h * D;
    const float* kg = k.data<float>() + h / group * D;
    const float* vg = v.data<float>() + h / group * D;
    float* oh = out.data<float>() + h * D;
    for (int64_t r0 = 0; r0 < n; r0 += block) {
      const int64_t r1 = std::min(n, r0 + block);
      const int64_t width = past + r1;
      cpu::gemm<float>(false, true, r1 - r0, width, D, scale, qh + r0 * ld_q, ld_q, kg, ld_kv,
                       0.0f, p, width);
      for (int64_t i = r0; i < r1; ++i)
        cpu::attention_internal::causal_softmax_row(p + (i - r0) * width, past + i + 1, width);
      cpu::gemm<float>(false, false, r1 - r0, D, width, 1.0f, p, width, vg, ld_kv, 0.0f,
                       oh + r0 * ld_q, ld_q);
    }
  }
}

YarnScaling yarn_scaling(const config::RopeScaling& scaling) {
  return {.factor = scaling.factor(),
          .original_max_positions = scaling.original_max_position_embeddings(),
          .beta_fast = scaling.beta_fast(),
          .beta_slow = scaling.beta_slow(),
          .mscale = scaling.mscale(),
          .mscale_all_dim = scaling.mscale_all_dim()};
}

Tensor rope_table_for(const config::ModelConfig& model, int64_t seq) {
  const bool latent = model.mla().kv_lora_rank() > 0;
  const int64_t dim = latent ? model.mla().qk_rope_head_dim() : model.head_dim();
  if (model.rope_scaling().type() == config::YARN)
    return yarn_rope_table(seq, dim, model.rope_theta(), yarn_scaling(model.rope_scaling()));
  return rope_table(seq, dim, model.rope_theta());
}

int64_t kv_cache_floats_per_position(const config::ModelConfig& model) {
  if (model.mla().kv_lora_rank() == 0) return 2 * int64_t{model.num_kv_heads()} * model.head_dim();
  return model.mla().kv_lora_rank() + model.mla().qk_rope_head_dim();
}

Tensor rope_view(const Tensor& x, bool per_position) {
  return per_position ? x.reshape({1, x.dim(0) * x.dim(1), x.dim(2), x.dim(3)}) : x;
}

Tensor document_rope_table(const Tensor& table, const Tensor& doc_starts) {
  const int64_t batch = doc_starts.dim(0), seq = doc_starts.dim(1), row = table.row_size();
  SY_CHECK_MSG(table.dim(0) >= seq, "document_rope_table: the table is shorter than a window");
  Tensor rows = Tensor::empty({batch * seq, table.dim(1), table.dim(2)});
  const int32_t* starts = doc_starts.data<int32_t>();
  for (int64_t r = 0; r < batch * seq; ++r) {
    const int64_t position = r % seq - starts[r];
    SY_CHECK_MSG(position >= 0 && position < seq, "document_rope_table: a start past its position");
    std::copy_n(table.data<float>() + position * row, row, rows.data<float>() + r * row);
  }
  return rows;
}

Attention::Attention(ParamStore& params, const std::string& prefix,
                     const config::ModelConfig& model, Communicator* tensor_parallel)
    : tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr),
      heads_(model.num_heads()),
      kv_heads_(model.num_kv_heads()),
      head_dim_(model.head_dim()),
      norm_eps_(model.norm_eps()),
      per_head_norm_(model.qk_head_norm()) {
  if (model.mla().kv_lora_rank() > 0) {
    latent_ = std::make_unique<LatentAttention>(params, prefix, model, tp_);
    return;
  }
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
  if (model.qk_norm() || model.qk_head_norm()) {
    // Replicated over tensor-parallel ranks (see the header).
    const int64_t q_width = per_head_norm_ ? head_dim_ : model.num_heads() * head_dim_;
    const int64_t k_width = per_head_norm_ ? head_dim_ : model.num_kv_heads() * head_dim_;
    q_norm_ = &params.add(prefix + "q_norm.weight", {q_width}, ShardSpec{}, ParamInit::kOnes);
    k_norm_ = &params.add(prefix + "k_norm.weight", {k_width}, ShardSpec{}, ParamInit::kOnes);
  }
}

Tensor Attention::normalize(Device& dev, const Tensor& proj, const Param& norm, Tensor& pre_norm,
                            Tensor& rstd) {
  if (per_head_norm_) {
    const int64_t rows = proj.numel() / head_dim_;
    pre_norm = proj.reshape({rows, head_dim_});
    rstd = activation(dev, {rows}, DType::kF32);
    Tensor normed = activation(dev, {rows, head_dim_}, proj.dtype());
    rmsnorm_forward(dev, pre_norm, norm.value, norm_eps_, normed, rstd);
    return normed.reshape(proj.shape());
  }
  pre_norm = tp_ ? gather_shards(*tp_, proj, 1).to(dev, MemoryKind::kActivations) : proj;
  rstd = activation(dev, {proj.rows()}, DType::kF32);
  Tensor normed = activation(dev, pre_norm.shape(), proj.dtype());
  rmsnorm_forward(dev, pre_norm, norm.value, norm_eps_, normed, rstd);
  if (!tp_) return normed;
  Tensor mine = activation(dev, proj.shape(), proj.dtype());
  copy_shard(normed, 1, tp_->rank(), tp_->size(), mine);
  return mine;
}

Tensor Attention::normalize_backward(Device& dev, const Tensor& dnormed, Param& norm,
                                     const Tensor& pre_norm, const Tensor& rstd) {
  if (per_head_norm_) {
    Tensor d = activation(dev, pre_norm.shape(), dnormed.dtype());
    const Tensor dy = dnormed.reshape(pre_norm.shape());
    if (!tp_) {
      rmsnorm_backward(dev, dy, pre_norm, norm.value, rstd, d, norm.grad);
      return d.reshape(dnormed.shape());
    }
    // The weight is replicated but saw only this rank's heads.
    Tensor dweight = Tensor::zeros(norm.grad.shape(), DType::kF32, MemoryKind::kActivations, dev);
    rmsnorm_backward(dev, dy, pre_norm, norm.value, rstd, d, dweight);
    tp_->all_reduce_sum(dweight);
    add_(dev, norm.grad, dweight);
    return d.reshape(dnormed.shape());
  }
  // Every rank runs the whole norm's backward on the gathered gradient, so the weight
  // gradient is the same on each.
  const Tensor dy = tp_ ? gather_shards(*tp_, dnormed, 1).to(dev, MemoryKind::kActivations) : dnormed;
  Tensor d = activation(dev, dy.shape(), dy.dtype());
  rmsnorm_backward(dev, dy, pre_norm, norm.value, rstd, d, norm.grad);
  if (!tp_) return d;
  Tensor mine = activation(dev, dnormed.shape(), dnormed.dtype());
  copy_shard(d, 1, tp_->rank(), tp_->size(), mine);
  return mine;
}

Tensor Attention::project(Device& dev, const Tensor& x, Param* weight, Param* bias, Param* norm,
                          Tensor* pre_norm, Tensor* rstd) {
  const int64_t n = x.rows();
  Tensor out = activation(dev, {n, weight->shape[0]}, x.dtype());
  matmul(dev, x, false, weight->work, true, out);
  if (bias) add_bias_(dev, out, bias->value);
  return norm ? normalize(dev, out, *norm, *pre_norm, *rstd) : out;
}

Tensor Attention::forward(Device& dev, const Tensor& x, int64_t batch, int64_t seq,
                          const Tensor& rope, const Tensor& doc_starts) {
  if (latent_) return latent_->forward(dev, x, batch, seq, rope, doc_starts);
  saved_.batch = batch;
  saved_.seq = seq;
  saved_.x = x;
  saved_.q = project(dev, x, wq_, q_bias_, q_norm_, &saved_.q_pre_norm, &saved_.q_rstd)
           .reshape({batch, seq, heads_, head_dim_});
  saved_.k = project(dev, x, wk_, k_bias_, k_norm_, &saved_.k_pre_norm, &saved_.k_rstd)
           .reshape({batch, seq, kv_heads_, head_dim_});
  saved_.v = project(dev, x, wv_, v_bias_, nullptr, nullptr, nullptr)
           .reshape({batch, seq, kv_heads_, head_dim_});
  saved_.doc_starts = doc_starts;
  const bool documents = saved_.doc_starts.defined();
  Tensor q_rows = rope_view(saved_.q, documents), k_rows = rope_view(saved_.k, documents);
  rope_forward(dev, rope, q_rows);
  rope_forward(dev, rope, k_rows);
  core_forward(dev);
  Tensor y = activation(dev, {batch * seq, wo_->shape[0]}, x.dtype());
  matmul(dev, saved_.attn_out, false, wo_->work, true, y);
  if (recompute_core_) saved_.attn_out = saved_.lse = Tensor();
  if (tp_) tensor_parallel_sum(dev, *tp_, y);
  return y;
}

void Attention::core_forward(Device& dev) {
  Tensor out4 = activation(dev, saved_.q.shape(), saved_.q.dtype());
  saved_.lse = activation(dev, {saved_.batch, heads_, saved_.seq}, DType::kF32);
  attention_forward(dev, saved_.q, saved_.k, saved_.v, out4, saved_.lse, saved_.doc_starts);
  saved_.attn_out = out4.reshape({saved_.batch * saved_.seq, heads_ * head_dim_});
}

void Attention::set_recompute_core(bool recompute) {
  recompute_core_ = recompute;
  if (latent_) latent_->set_recompute_core(recompute);
}

void Attention::discard() {
  saved_ = {};
  if (latent_) latent_->discard();
}

Attention::Stash Attention::stash() {
  return {std::exchange(saved_, {}), latent_ ? latent_->stash() : LatentAttention::Saved{}};
}

void Attention::restore(Stash&& stash) {
  saved_ = std::move(stash.own);
  if (latent_) latent_->restore(std::move(stash.latent));
}

KvCache Attention::empty_cache(int64_t positions) const {
  if (latent_) return latent_->empty_cache(positions);
  return {Tensor::zeros({positions, kv_heads_, head_dim_}),
          Tensor::zeros({positions, kv_heads_, head_dim_})};
}

Tensor Attention::decode(Device& dev, const Tensor& x, int64_t past, const Tensor& rope,
                         KvCache& cache) {
  if (latent_) return latent_->decode(dev, x, past, rope, cache);
  SY_CHECK_MSG(!dev.is_cuda() && x.dtype() == DType::kF32 && !tp_,
               "attention decode runs on the CPU in f32 on one rank");
  const int64_t n = x.rows();
  SY_CHECK_MSG(past >= 0 && past + n <= cache.k.dim(0), "attention decode: the cache is full");
  Tensor q_pre_norm, k_pre_norm, q_rstd, k_rstd;
  Tensor q = project(dev, x, wq_, q_bias_, q_norm_, &q_pre_norm, &q_rstd)
                 .reshape({1, n, heads_, head_dim_});
  Tensor k = project(dev, x, wk_, k_bias_, k_norm_, &k_pre_norm, &k_rstd)
                 .reshape({1, n, kv_heads_, head_dim_});
  const Tensor v = project(dev, x, wv_, v_bias_, nullptr, nullptr, nullptr);
  const Tensor positions = rope.slice_rows(past, past + n);
  rope_forward(dev, positions, q);
  rope_forward(dev, positions, k);
  cache.k.slice_rows(past, past + n).copy_from(k.reshape({n, kv_heads_, head_dim_}));
  cache.v.slice_rows(past, past + n).copy_from(v.reshape({n, kv_heads_, head_dim_}));
  Tensor out = activation(dev, {n, heads_ * head_dim_}, DType::kF32);
  Tensor out3 = out.reshape({n, heads_, head_dim_});
  attend_cached(q.reshape({n, heads_, head_dim_}), cache.k, cache.v, past, out3);
  Tensor y = activation(dev, {n, wo_->shape[0]}, DType::kF32);
  matmul(dev, out, false, wo_->work, true, y);
  return y;
}

void Attention::project_backward(Device& dev, Tensor& dproj, Param* weight, Param* bias,
                                 Param* norm, const Tensor& pre_norm, const Tensor& rstd,
                                 Tensor& dx) {
  const Tensor d = norm ? normalize_backward(dev, dproj, *norm, pre_norm, rstd) : dproj;
  if (bias) bias_backward(dev, d, bias->grad);
  matmul(dev, d, true, saved_.x, false, weight->grad, 1.0f, 1.0f);
  matmul(dev, d, false, weight->work, false, dx, 1.0f, 1.0f);
}

Tensor Attention::backward(Device& dev, const Tensor& dy, const Tensor& rope) {
  if (latent_) return latent_->backward(dev, dy, rope);
  const int64_t n = dy.rows();
  const DType dtype = dy.dtype();
  if (recompute_core_) core_forward(dev);
  matmul(dev, dy, true, saved_.attn_out, false, wo_->grad, 1.0f, 1.0f);
  Tensor dattn = activation(dev, {saved_.batch, saved_.seq, heads_, head_dim_}, dtype);
  Tensor dattn2 = dattn.reshape({n, heads_ * head_dim_});
  matmul(dev, dy, false, wo_->work, false, dattn2);
  Tensor dq = activation(dev, saved_.q.shape(), dtype);
  Tensor dk = activation(dev, saved_.k.shape(), dtype);
  Tensor dv = activation(dev, saved_.v.shape(), dtype);
  const Tensor out4 = saved_.attn_out.reshape({saved_.batch, saved_.seq, heads_, head_dim_});
  attention_backward(dev, dattn, saved_.q, saved_.k, saved_.v, out4, saved_.lse, dq, dk, dv,
                     saved_.doc_starts);
  const bool documents = saved_.doc_starts.defined();
  Tensor dq_rows = rope_view(dq, documents), dk_rows = rope_view(dk, documents);
  rope_backward(dev, rope, dq_rows);
  rope_backward(dev, rope, dk_rows);

  Tensor dx = Tensor::zeros({n, saved_.x.row_size()}, dtype, MemoryKind::kActivations, dev);
  Tensor dq2 = dq.reshape({n, heads_ * head_dim_});
  Tensor dk2 = dk.reshape({n, kv_heads_ * head_dim_});
  Tensor dv2 = dv.reshape({n, kv_heads_ * head_dim_});
  project_backward(dev, dq2, wq_, q_bias_, q_norm_, saved_.q_pre_norm, saved_.q_rstd, dx);
  project_backward(dev, dk2, wk_, k_bias_, k_norm_, saved_.k_pre_norm, saved_.k_rstd, dx);
  project_backward(dev, dv2, wv_, v_bias_, nullptr, Tensor(), Tensor(), dx);
  if (tp_) tensor_parallel_sum(dev, *tp_, dx);
  discard();
  return dx;
}

}  // namespace switchyard
