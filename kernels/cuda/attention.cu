#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

constexpr int kAttentionThreads = 128;
// Head dims up to this keep the kernels' shared rows within the default 48 KiB.
constexpr int64_t kMaxHeadDim = 2048;

// Element offsets of row `pos` of head `head` in a (B, S, heads, D) tensor and of row `i`
// of a (B, H, S, S) probs tensor.
__device__ inline int64_t row_offset(const AttentionShape& s, int64_t b, int64_t pos, int64_t head,
                                     int64_t heads) {
  return ((b * s.seq + pos) * heads + head) * s.head_dim;
}
__device__ inline int64_t probs_offset(const AttentionShape& s, int64_t b, int64_t h, int64_t i) {
  return ((b * s.heads + h) * s.seq + i) * s.seq;
}

template <typename T>
__device__ float dot_row(const float* shared_row, const T* global_row, int64_t d) {
  float dot = 0.0f;
  for (int64_t c = 0; c < d; ++c) dot += shared_row[c] * static_cast<float>(global_row[c]);
  return dot;
}

// Block (i, h, b): query row i of head h. The scores are computed three times (max, sum,
// normalised probability) rather than staged, so the probability row is written once.
template <typename T>
__global__ void attention_forward_kernel(const T* q, const T* k, const T* v, AttentionShape s,
                                         float scale, T* out, float* probs) {
  extern __shared__ float q_row[];  // (D)
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t D = s.head_dim;
  const int64_t g = h / (s.heads / s.kv_heads);
  const T* qi = q + row_offset(s, b, i, h, s.heads);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) q_row[c] = static_cast<float>(qi[c]);
  __syncthreads();
  auto score = [&](int64_t j) {
    return scale * dot_row(q_row, k + row_offset(s, b, j, g, s.kv_heads), D);
  };

  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) local_max = fmaxf(local_max, score(j));
  const float max = block_max(local_max);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) local_sum += expf(score(j) - max);
  const float inv = 1.0f / block_sum(local_sum);
  float* p = probs + probs_offset(s, b, h, i);
  for (int64_t j = threadIdx.x; j < s.seq; j += blockDim.x)
    p[j] = j <= i ? expf(score(j) - max) * inv : 0.0f;
  __syncthreads();  // the whole probability row is written before any thread reads it

  T* oi = out + row_offset(s, b, i, h, s.heads);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j <= i; ++j)
      acc += p[j] * static_cast<float>(v[row_offset(s, b, j, g, s.kv_heads) + c]);
    oi[c] = static_cast<T>(acc);
  }
}

// Block (i, h, b): dp_ij = dout_i . v_j, row_dot_i = sum_j p_ij dp_ij, ds_ij = p_ij (dp_ij -
// row_dot_i), dq_i = scale * sum_j ds_ij k_j. Key rows go in tiles of blockDim: each
// thread makes one ds of the tile, then each thread adds the tile into its columns.
template <typename T>
__global__ void attention_dq_kernel(const T* dout, const T* k, const T* v, const float* probs,
                                    AttentionShape s, float scale, T* dq, float* row_dots) {
  extern __shared__ float shared[];
  const int64_t D = s.head_dim;
  float* do_row = shared;           // (D)
  float* acc = shared + D;          // (D)
  float* ds_tile = shared + 2 * D;  // (blockDim)
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (s.heads / s.kv_heads);
  const T* doi = dout + row_offset(s, b, i, h, s.heads);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    do_row[c] = static_cast<float>(doi[c]);
    acc[c] = 0.0f;
  }
  __syncthreads();
  const float* p = probs + probs_offset(s, b, h, i);
  auto dp = [&](int64_t j) { return dot_row(do_row, v + row_offset(s, b, j, g, s.kv_heads), D); };

  float local = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) local += p[j] * dp(j);
  const float row_dot = block_sum(local);
  if (threadIdx.x == 0) row_dots[(b * s.heads + h) * s.seq + i] = row_dot;

  for (int64_t j0 = 0; j0 <= i; j0 += blockDim.x) {
    const int64_t j = j0 + threadIdx.x;
    if (j <= i) ds_tile[threadIdx.x] = p[j] * (dp(j) - row_dot);
    __syncthreads();
    const int64_t tile = i + 1 - j0 < blockDim.x ? i + 1 - j0 : blockDim.x;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      float a = acc[c];
      for (int64_t t = 0; t < tile; ++t)
        a += ds_tile[t] * static_cast<float>(k[row_offset(s, b, j0 + t, g, s.kv_heads) + c]);
      acc[c] = a;
    }
    __syncthreads();
  }
  T* dqi = dq + row_offset(s, b, i, h, s.heads);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) dqi[c] = static_cast<T>(scale * acc[c]);
}

// Block (j, g, b): key row j of KV head g. dk_j = scale * sum_h sum_{i >= j} ds_ij q_i and
// dv_j = sum_h sum_{i >= j} p_ij dout_i over the query heads h of the group, in head order;
// query rows go in tiles of blockDim as in attention_dq_kernel.
template <typename T>
__global__ void attention_dkv_kernel(const T* dout, const T* q, const T* v, const float* probs,
                                     const float* row_dots, AttentionShape s, float scale, T* dk,
                                     T* dv) {
  extern __shared__ float shared[];
  const int64_t D = s.head_dim;
  float* v_row = shared;                        // (D)
  float* acc_k = shared + D;                    // (D)
  float* acc_v = shared + 2 * D;                // (D)
  float* ds_tile = shared + 3 * D;              // (blockDim)
  float* p_tile = shared + 3 * D + blockDim.x;  // (blockDim)
  const int64_t j = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int64_t group = s.heads / s.kv_heads;
  const T* vj = v + row_offset(s, b, j, g, s.kv_heads);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    v_row[c] = static_cast<float>(vj[c]);
    acc_k[c] = 0.0f;
    acc_v[c] = 0.0f;
  }
  __syncthreads();
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = j; i0 < s.seq; i0 += blockDim.x) {
      const int64_t i = i0 + threadIdx.x;
      if (i < s.seq) {
        const float p = probs[probs_offset(s, b, h, i) + j];
        const float dp = dot_row(v_row, dout + row_offset(s, b, i, h, s.heads), D);
        ds_tile[threadIdx.x] = p * (dp - row_dots[(b * s.heads + h) * s.seq + i]);
        p_tile[threadIdx.x] = p;
      }
      __syncthreads();
      const int64_t tile = s.seq - i0 < blockDim.x ? s.seq - i0 : blockDim.x;
      for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        float ak = acc_k[c];
        float av = acc_v[c];
        for (int64_t t = 0; t < tile; ++t) {
          const int64_t at = row_offset(s, b, i0 + t, h, s.heads) + c;
          ak += ds_tile[t] * static_cast<float>(q[at]);
          av += p_tile[t] * static_cast<float>(dout[at]);
        }
        acc_k[c] = ak;
        acc_v[c] = av;
      }
      __syncthreads();
    }
  }
  T* dkj = dk + row_offset(s, b, j, g, s.kv_heads);
  T* dvj = dv + row_offset(s, b, j, g, s.kv_heads);
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    dkj[c] = static_cast<T>(scale * acc_k[c]);
    dvj[c] = static_cast<T>(acc_v[c]);
  }
}

// Grid (rows, heads, batch); checks the limits of the y and z dimensions.
dim3 attention_grid(int64_t rows, int64_t heads, int64_t batch) {
  SY_CHECK_MSG(rows <= INT32_MAX && heads <= 65535 && batch <= 65535,
               "attention: shape exceeds the CUDA grid");
  return dim3(static_cast<unsigned int>(rows), static_cast<unsigned int>(heads),
              static_cast<unsigned int>(batch));
}

float attention_scale(const AttentionShape& s) {
  return 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}

}  // namespace

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, const AttentionShape& s, T* out,
                       float* probs, cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  SY_CHECK_MSG(s.head_dim <= kMaxHeadDim, "attention: head_dim too large for the CUDA kernel");
  const size_t shared_bytes = static_cast<size_t>(s.head_dim) * sizeof(float);
  attention_forward_kernel<<<attention_grid(s.seq, s.heads, s.batch), kAttentionThreads,
                             shared_bytes, stream>>>(q, k, v, s, attention_scale(s), out, probs);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const float* probs,
                        const AttentionShape& s, T* dq, T* dk, T* dv, cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  SY_CHECK_MSG(s.head_dim <= kMaxHeadDim, "attention: head_dim too large for the CUDA kernel");
  const float scale = attention_scale(s);
  Scratch<float> row_dots(s.batch * s.heads * s.seq, stream);
  const size_t dq_shared = (2 * s.head_dim + kAttentionThreads) * sizeof(float);
  attention_dq_kernel<<<attention_grid(s.seq, s.heads, s.batch), kAttentionThreads, dq_shared,
                        stream>>>(dout, k, v, probs, s, scale, dq, row_dots.get());
  SY_CUDA_CHECK_LAUNCH();
  const size_t dkv_shared = (3 * s.head_dim + 2 * kAttentionThreads) * sizeof(float);
  attention_dkv_kernel<<<attention_grid(s.seq, s.kv_heads, s.batch), kAttentionThreads, dkv_shared,
                         stream>>>(dout, q, v, probs, row_dots.get(), s, scale, dk, dv);
  SY_CUDA_CHECK_LAUNCH();
}

#define SY_INSTANTIATE_ATTENTION(T)                                                           \
  template void attention_forward<T>(const T*, const T*, const T*, const AttentionShape&, T*, \
                                     float*, cudaStream_t);                                   \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const float*,   \
                                      const AttentionShape&, T*, T*, T*, cudaStream_t);
SY_INSTANTIATE_ATTENTION(float)
SY_INSTANTIATE_ATTENTION(__nv_bfloat16)
#undef SY_INSTANTIATE_ATTENTION

}  // namespace switchyard::cuda
