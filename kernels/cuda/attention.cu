#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

// Threads per block of the tile kernels: eight warps, which share each product's 16 x 16
// output fragments.
constexpr int kAttentionThreads = 256;
constexpr int kWarps = kAttentionThreads / 32;

// Whether the products of element type T run on tensor cores (bf16) or as plain f32 loops.
template <typename T>
constexpr bool kTensorCores = std::is_same_v<T, __nv_bfloat16>;

// Shared-memory regions start on 128-byte boundaries (wmma needs 32).
__host__ __device__ constexpr size_t aligned(size_t bytes) { return (bytes + 127) / 128 * 128; }

// The tiles of element type T for head dims up to DP (64 or 128; the columns from head_dim
// to DP are zeros).
template <typename T, int DP>
struct Tile {
  // Query or key rows per tile. float operands take twice the bytes, and 32 rows keep the
  // backward's eight tiles within shared memory.
  static constexpr int kRows = kTensorCores<T> ? 64 : 32;
  // Row strides in elements: padded so that rows start in different banks, and multiples
  // of 16 bytes as wmma's ldm must be.
  static constexpr int kLdOperand = DP + 8;   // T (rows, DP): q, k, v, dout
  static constexpr int kLdScore = kRows + 4;  // float (rows, rows): scores, dp
  static constexpr int kLdProb = kRows + 8;   // T (rows, rows): probabilities, ds
  static constexpr int kLdAcc = DP + 4;       // float (rows, DP): sums for out, dq, dk, dv
  static constexpr size_t kOperandBytes = aligned(kRows * kLdOperand * sizeof(T));
  static constexpr size_t kScoreBytes = aligned(kRows * kLdScore * sizeof(float));
  static constexpr size_t kProbBytes = aligned(kRows * kLdProb * sizeof(T));
  static constexpr size_t kAccBytes = aligned(kRows * kLdAcc * sizeof(float));
  static constexpr size_t kRowBytes = aligned(kRows * sizeof(float));
  // Threads per row in the row-wise phases: consecutive lanes of one warp.
  static constexpr int kPerRow = kAttentionThreads / kRows;
  static_assert(kPerRow >= 1 && kPerRow <= 32 && kAttentionThreads % kRows == 0);
};

// Byte offsets of each kernel's shared regions (the host sizes the launch from kBytes).
template <typename T, int DP>
struct ForwardLayout {
  using G = Tile<T, DP>;
  static constexpr size_t kQ = 0, kK = kQ + G::kOperandBytes, kV = kK + G::kOperandBytes;
  static constexpr size_t kScores = kV + G::kOperandBytes, kProbs = kScores + G::kScoreBytes;
  static constexpr size_t kAcc = kProbs + G::kProbBytes, kBytes = kAcc + G::kAccBytes;
};

template <typename T, int DP>
struct DkvLayout {
  using G = Tile<T, DP>;
  static constexpr size_t kK = 0, kV = kK + G::kOperandBytes, kQ = kV + G::kOperandBytes;
  static constexpr size_t kDout = kQ + G::kOperandBytes, kScores = kDout + G::kOperandBytes;
  static constexpr size_t kDp = kScores + G::kScoreBytes, kProbs = kDp + G::kScoreBytes;
  static constexpr size_t kDs = kProbs + G::kProbBytes, kDkAcc = kDs + G::kProbBytes;
  static constexpr size_t kDvAcc = kDkAcc + G::kAccBytes, kLse = kDvAcc + G::kAccBytes;
  static constexpr size_t kRowDots = kLse + G::kRowBytes, kBytes = kRowDots + G::kRowBytes;
};

template <typename T, int DP>
struct DqLayout {
  using G = Tile<T, DP>;
  static constexpr size_t kQ = 0, kDout = kQ + G::kOperandBytes, kK = kDout + G::kOperandBytes;
  static constexpr size_t kV = kK + G::kOperandBytes, kScores = kV + G::kOperandBytes;
  static constexpr size_t kDp = kScores + G::kScoreBytes, kDs = kDp + G::kScoreBytes;
  static constexpr size_t kDqAcc = kDs + G::kProbBytes, kLse = kDqAcc + G::kAccBytes;
  static constexpr size_t kRowDots = kLse + G::kRowBytes, kBytes = kRowDots + G::kRowBytes;
};

template <typename U>
__device__ U* region(unsigned char* shared, size_t offset) {
  return reinterpret_cast<U*>(shared + offset);
}

// c (M, N) = a (M, K) @ b (K, N), or c += it with kAccumulate; a, b tiles of T in shared
// memory, c float in shared memory, all row strides in elements. a(m, x) is a[m * lda + x],
// or a[m + x * lda] with kAColMajor (a transposed tile); likewise b(x, n) is b[x * ldb + n],
// or b[x + n * ldb] with kBColMajor. K is a multiple of 16. bf16 runs wmma 16x16x16 with f32
// accumulators, each warp taking whole output fragments; float runs one output element
// per thread at a time. Either way each element's sum has a fixed order.
template <typename T, int M, int N, bool kAColMajor, bool kBColMajor, bool kAccumulate>
__device__ void block_mm(const T* a, int lda, const T* b, int ldb, float* c, int ldc, int K) {
  static_assert(M % 16 == 0 && N % 16 == 0);
  if constexpr (kTensorCores<T>) {
    namespace wmma = nvcuda::wmma;
    using ALayout = std::conditional_t<kAColMajor, wmma::col_major, wmma::row_major>;
    using BLayout = std::conditional_t<kBColMajor, wmma::col_major, wmma::row_major>;
    constexpr int kColFragments = N / 16;
    for (int f = threadIdx.x / 32; f < (M / 16) * kColFragments; f += kWarps) {
      const int m0 = f / kColFragments * 16, n0 = f % kColFragments * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      if constexpr (kAccumulate)
        wmma::load_matrix_sync(acc, c + m0 * ldc + n0, ldc, wmma::mem_row_major);
      else
        wmma::fill_fragment(acc, 0.0f);
      for (int x0 = 0; x0 < K; x0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, ALayout> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> fb;
        wmma::load_matrix_sync(fa, a + (kAColMajor ? m0 + x0 * lda : m0 * lda + x0), lda);
        wmma::load_matrix_sync(fb, b + (kBColMajor ? x0 + n0 * ldb : x0 * ldb + n0), ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(c + m0 * ldc + n0, acc, ldc, wmma::mem_row_major);
    }
  } else {
    for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
      const int m = e / N, n = e % N;
      float sum = 0.0f;
      for (int x = 0; x < K; ++x) {
        const float av = static_cast<float>(kAColMajor ? a[m + x * lda] : a[m * lda + x]);
        const float bv = static_cast<float>(kBColMajor ? b[x + n * ldb] : b[x * ldb + n]);
        sum += av * bv;
      }
      c[m * ldc + n] = kAccumulate ? c[m * ldc + n] + sum : sum;
    }
  }
}

// Rows pos0 .. pos0 + rows of head `head` of a (B, S, heads, D) tensor into a (rows, DP)
// tile; rows past the sequence and columns past head_dim are zeros.
template <typename T, int DP>
__device__ void load_rows(T* tile, int ld, const T* src, const AttentionShape& s, int64_t b,
                          int64_t pos0, int64_t head, int64_t heads, int rows) {
  for (int e = threadIdx.x; e < rows * DP; e += blockDim.x) {
    const int r = e / DP, c = e % DP;
    const int64_t pos = pos0 + r;
    tile[r * ld + c] = pos < s.seq && c < s.head_dim
                           ? src[((b * s.seq + pos) * heads + head) * s.head_dim + c]
                           : static_cast<T>(0.0f);
  }
}

// factor * a (rows, DP) float tile into rows pos0 .. of head `head` of a (B, S, heads, D)
// tensor, within the sequence and head_dim.
template <typename T, int DP>
__device__ void store_rows(T* dst, const float* tile, int ld, float factor, const AttentionShape& s,
                           int64_t b, int64_t pos0, int64_t head, int64_t heads, int rows) {
  for (int e = threadIdx.x; e < rows * DP; e += blockDim.x) {
    const int r = e / DP, c = e % DP;
    const int64_t pos = pos0 + r;
    if (pos < s.seq && c < s.head_dim)
      dst[((b * s.seq + pos) * heads + head) * s.head_dim + c] =
          static_cast<T>(factor * tile[r * ld + c]);
  }
}

// Values of rows pos0 .. of head h in a (B, H, S) float tensor (lse, row dots); zeros past
// the sequence.
__device__ void load_row_values(float* dst, const float* src, const AttentionShape& s, int64_t b,
                                int64_t h, int64_t pos0, int rows) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t pos = pos0 + r;
    dst[r] = pos < s.seq ? src[(b * s.heads + h) * s.seq + pos] : 0.0f;
  }
}

// Max and sum over the kWidth consecutive lanes that share a row, in butterfly order, so
// every lane gets the same bits.
template <int kWidth>
__device__ float row_max(float x) {
  for (int o = kWidth / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <int kWidth>
__device__ float row_sum(float x) {
  for (int o = kWidth / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The first key query i of window b reads: its document's start, or 0 without documents
// (doc_starts null) and for rows past the sequence.
__device__ inline int64_t key_start(const int32_t* doc_starts, int64_t b, int64_t seq, int64_t i) {
  return doc_starts && i < seq ? doc_starts[b * seq + i] : 0;
}

// The first key tile (a multiple of R) that the query tile at q0 reads: starts do not
// decrease along a window, so the tile's first row has the smallest.
__device__ inline int64_t first_key_tile(const int32_t* doc_starts, int64_t b, int64_t seq,
                                         int64_t q0, int R) {
  return key_start(doc_starts, b, seq, q0) / R * R;
}

// head_dim rounded up to the tensor-core step: the products' inner length over q, k, v,
// dout (the zero columns up to it add nothing).
__device__ inline int inner_dim(const AttentionShape& s) {
  return static_cast<int>((s.head_dim + 15) / 16 * 16);
}

// Block (tile, h, b): query rows q0 .. q0 + R of head h. Key tiles up to the diagonal one
// stream through shared memory; each row keeps its running max and sum in registers (the
// kPerRow threads of a row hold the same values) and its output sum, rescaled whenever
// the max grows, in shared memory.
template <typename T, int DP>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_kernel(const T* q, const T* k, const T* v, AttentionShape s,
                             const int32_t* doc_starts, float scale, T* out, float* lse) {
  using G = Tile<T, DP>;
  using L = ForwardLayout<T, DP>;
  constexpr int R = G::kRows;
  extern __shared__ __align__(128) unsigned char attention_shared[];
  T* q_tile = region<T>(attention_shared, L::kQ);
  T* k_tile = region<T>(attention_shared, L::kK);
  T* v_tile = region<T>(attention_shared, L::kV);
  float* scores = region<float>(attention_shared, L::kScores);
  T* probs = region<T>(attention_shared, L::kProbs);
  float* acc = region<float>(attention_shared, L::kAcc);

  // The last query tiles see the most keys and start first.
  const int64_t q0 = (ceil_div(s.seq, R) - 1 - blockIdx.x) * R;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (s.heads / s.kv_heads);
  const int inner = inner_dim(s);
  load_rows<T, DP>(q_tile, G::kLdOperand, q, s, b, q0, h, s.heads, R);
  for (int e = threadIdx.x; e < R * DP; e += blockDim.x) acc[e / DP * G::kLdAcc + e % DP] = 0.0f;

  const int row = threadIdx.x / G::kPerRow, part = threadIdx.x % G::kPerRow;
  const int64_t i = q0 + row;
  const int64_t start_i = key_start(doc_starts, b, s.seq, i);
  float* score_row = scores + row * G::kLdScore;
  T* prob_row = probs + row * G::kLdProb;
  float* acc_row = acc + row * G::kLdAcc;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t k0 = first_key_tile(doc_starts, b, s.seq, q0, R); k0 <= q0; k0 += R) {
    __syncthreads();  // the previous tile's k, v and probabilities are consumed
    load_rows<T, DP>(k_tile, G::kLdOperand, k, s, b, k0, g, s.kv_heads, R);
    load_rows<T, DP>(v_tile, G::kLdOperand, v, s, b, k0, g, s.kv_heads, R);
    __syncthreads();
    block_mm<T, R, R, false, true, false>(q_tile, G::kLdOperand, k_tile, G::kLdOperand, scores,
                                          G::kLdScore, inner);
    __syncthreads();
    float tile_max = -INFINITY;
    for (int c = part; c < R; c += G::kPerRow) {
      const float x = k0 + c <= i && k0 + c >= start_i ? scale * score_row[c] : -INFINITY;
      score_row[c] = x;
      tile_max = fmaxf(tile_max, x);
    }
    // Without documents key k0 <= q0 <= i is in every tile, so the new max is finite. A
    // row whose document starts past this tile has no key yet: it shifts by 0, and its
    // probabilities and sums stay 0.
    const float new_max = fmaxf(running_max, row_max<G::kPerRow>(tile_max));
    const float shift = new_max == -INFINITY ? 0.0f : new_max;
    float tile_sum = 0.0f;
    for (int c = part; c < R; c += G::kPerRow) {
      const float p = expf(score_row[c] - shift);
      prob_row[c] = static_cast<T>(p);
      tile_sum += p;
    }
    const float rescale = expf(running_max - shift);  // 0 on the row's first tile
    running_sum = running_sum * rescale + row_sum<G::kPerRow>(tile_sum);
    running_max = new_max;
    for (int c = part; c < DP; c += G::kPerRow) acc_row[c] *= rescale;
    __syncthreads();
    block_mm<T, R, DP, false, false, true>(probs, G::kLdProb, v_tile, G::kLdOperand, acc, G::kLdAcc,
                                           R);
  }
  __syncthreads();
  const float inv = 1.0f / running_sum;
  for (int c = part; c < DP; c += G::kPerRow) acc_row[c] *= inv;
  if (part == 0 && i < s.seq) lse[(b * s.heads + h) * s.seq + i] = running_max + logf(running_sum);
  __syncthreads();
  store_rows<T, DP>(out, acc, G::kLdAcc, 1.0f, s, b, q0, h, s.heads, R);
}

// Row r of (B * S * H) rows: row_dots[b, h, i] = dout_i . out_i, one warp per row, lanes
// over the columns and then a butterfly sum.
template <typename T>
__global__ void attention_row_dots_kernel(const T* dout, const T* out, AttentionShape s,
                                          float* row_dots) {
  const int64_t rows = s.batch * s.seq * s.heads;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
       r += warps) {
    float sum = 0.0f;
    for (int64_t c = lane; c < s.head_dim; c += 32) {
      const int64_t at = r * s.head_dim + c;
      sum += static_cast<float>(dout[at]) * static_cast<float>(out[at]);
    }
    sum = row_sum<32>(sum);
    if (lane == 0) {
      const int64_t h = r % s.heads, i = r / s.heads % s.seq, b = r / (s.heads * s.seq);
      row_dots[(b * s.heads + h) * s.seq + i] = sum;
    }
  }
}

// p_ij = exp(scale * score_ij - lse_i) for the causal pairs of the tiles at q0 and k0 (zero
// elsewhere: rows past the sequence, keys before the row's document start) and ds_ij = p_ij (dp_ij - row_dot_i), as
// tiles of T for the products that follow. `probs` may be null (the dq pass needs only ds).
template <typename T, int R>
__device__ void probs_and_ds(const float* scores, const float* dp, int ld_score, const float* lse,
                             const float* row_dots, float scale, int64_t q0, int64_t k0,
                             int64_t seq, const int32_t* doc_starts, int64_t b, T* probs, T* ds,
                             int ld_prob) {
  for (int e = threadIdx.x; e < R * R; e += blockDim.x) {
    const int r = e / R, c = e % R;
    const int64_t i = q0 + r, j = k0 + c;
    const bool seen = i < seq && j <= i && j >= key_start(doc_starts, b, seq, i);
    const float p = seen ? expf(scale * scores[r * ld_score + c] - lse[r]) : 0.0f;
    if (probs) probs[r * ld_prob + c] = static_cast<T>(p);
    ds[r * ld_prob + c] = static_cast<T>(p * (dp[r * ld_score + c] - row_dots[r]));
  }
}

// Block (key tile, g, b): key rows k0 .. k0 + R of KV head g. For each query head of the
// group in order, and each query tile from the diagonal one down in order: dv += p^T dout,
// dk += ds^T q, with the sums in shared memory; scale applied to dk at the end.
template <typename T, int DP>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dkv_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                         const float* row_dots, AttentionShape s, const int32_t* doc_starts,
                         float scale, T* dk, T* dv) {
  using G = Tile<T, DP>;
  using L = DkvLayout<T, DP>;
  constexpr int R = G::kRows;
  extern __shared__ __align__(128) unsigned char attention_shared[];
  T* k_tile = region<T>(attention_shared, L::kK);
  T* v_tile = region<T>(attention_shared, L::kV);
  T* q_tile = region<T>(attention_shared, L::kQ);
  T* dout_tile = region<T>(attention_shared, L::kDout);
  float* scores = region<float>(attention_shared, L::kScores);
  float* dp = region<float>(attention_shared, L::kDp);
  T* probs = region<T>(attention_shared, L::kProbs);
  T* ds = region<T>(attention_shared, L::kDs);
  float* dk_acc = region<float>(attention_shared, L::kDkAcc);
  float* dv_acc = region<float>(attention_shared, L::kDvAcc);
  float* lse_rows = region<float>(attention_shared, L::kLse);
  float* dot_rows = region<float>(attention_shared, L::kRowDots);

  // The first key tiles see the most queries and start first.
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t g = blockIdx.y, b = blockIdx.z;
  const int64_t group = s.heads / s.kv_heads;
  const int inner = inner_dim(s);
  load_rows<T, DP>(k_tile, G::kLdOperand, k, s, b, k0, g, s.kv_heads, R);
  load_rows<T, DP>(v_tile, G::kLdOperand, v, s, b, k0, g, s.kv_heads, R);
  for (int e = threadIdx.x; e < R * DP; e += blockDim.x) {
    dk_acc[e / DP * G::kLdAcc + e % DP] = 0.0f;
    dv_acc[e / DP * G::kLdAcc + e % DP] = 0.0f;
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    // Query tiles whose first document starts past this key tile see none of it, nor
    // do the ones after them.
    for (int64_t q0 = k0; q0 < s.seq && key_start(doc_starts, b, s.seq, q0) < k0 + R; q0 += R) {
      __syncthreads();  // the previous query tile is consumed
      load_rows<T, DP>(q_tile, G::kLdOperand, q, s, b, q0, h, s.heads, R);
      load_rows<T, DP>(dout_tile, G::kLdOperand, dout, s, b, q0, h, s.heads, R);
      load_row_values(lse_rows, lse, s, b, h, q0, R);
      load_row_values(dot_rows, row_dots, s, b, h, q0, R);
      __syncthreads();
      block_mm<T, R, R, false, true, false>(q_tile, G::kLdOperand, k_tile, G::kLdOperand, scores,
                                            G::kLdScore, inner);
      block_mm<T, R, R, false, true, false>(dout_tile, G::kLdOperand, v_tile, G::kLdOperand, dp,
                                            G::kLdScore, inner);
      __syncthreads();
      probs_and_ds<T, R>(scores, dp, G::kLdScore, lse_rows, dot_rows, scale, q0, k0, s.seq,
                         doc_starts, b, probs, ds, G::kLdProb);
      __syncthreads();
      // Transposed tiles: rows are keys, the inner dimension the tile's queries.
      block_mm<T, R, DP, true, false, true>(probs, G::kLdProb, dout_tile, G::kLdOperand, dv_acc,
                                            G::kLdAcc, R);
      block_mm<T, R, DP, true, false, true>(ds, G::kLdProb, q_tile, G::kLdOperand, dk_acc,
                                            G::kLdAcc, R);
    }
  }
  __syncthreads();
  store_rows<T, DP>(dk, dk_acc, G::kLdAcc, scale, s, b, k0, g, s.kv_heads, R);
  store_rows<T, DP>(dv, dv_acc, G::kLdAcc, 1.0f, s, b, k0, g, s.kv_heads, R);
}

// Block (tile, h, b): query rows q0 .. q0 + R of head h; dq += ds k over the key tiles up
// to the diagonal in order, scale applied at the end.
template <typename T, int DP>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_dq_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                        const float* row_dots, AttentionShape s, const int32_t* doc_starts,
                        float scale, T* dq) {
  using G = Tile<T, DP>;
  using L = DqLayout<T, DP>;
  constexpr int R = G::kRows;
  extern __shared__ __align__(128) unsigned char attention_shared[];
  T* q_tile = region<T>(attention_shared, L::kQ);
  T* dout_tile = region<T>(attention_shared, L::kDout);
  T* k_tile = region<T>(attention_shared, L::kK);
  T* v_tile = region<T>(attention_shared, L::kV);
  float* scores = region<float>(attention_shared, L::kScores);
  float* dp = region<float>(attention_shared, L::kDp);
  T* ds = region<T>(attention_shared, L::kDs);
  float* dq_acc = region<float>(attention_shared, L::kDqAcc);
  float* lse_rows = region<float>(attention_shared, L::kLse);
  float* dot_rows = region<float>(attention_shared, L::kRowDots);

  const int64_t q0 = (ceil_div(s.seq, R) - 1 - blockIdx.x) * R;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (s.heads / s.kv_heads);
  const int inner = inner_dim(s);
  load_rows<T, DP>(q_tile, G::kLdOperand, q, s, b, q0, h, s.heads, R);
  load_rows<T, DP>(dout_tile, G::kLdOperand, dout, s, b, q0, h, s.heads, R);
  load_row_values(lse_rows, lse, s, b, h, q0, R);
  load_row_values(dot_rows, row_dots, s, b, h, q0, R);
  for (int e = threadIdx.x; e < R * DP; e += blockDim.x) dq_acc[e / DP * G::kLdAcc + e % DP] = 0.0f;
  for (int64_t k0 = first_key_tile(doc_starts, b, s.seq, q0, R); k0 <= q0; k0 += R) {
    __syncthreads();  // the previous key tile is consumed
    load_rows<T, DP>(k_tile, G::kLdOperand, k, s, b, k0, g, s.kv_heads, R);
    load_rows<T, DP>(v_tile, G::kLdOperand, v, s, b, k0, g, s.kv_heads, R);
    __syncthreads();
    block_mm<T, R, R, false, true, false>(q_tile, G::kLdOperand, k_tile, G::kLdOperand, scores,
                                          G::kLdScore, inner);
    block_mm<T, R, R, false, true, false>(dout_tile, G::kLdOperand, v_tile, G::kLdOperand, dp,
                                          G::kLdScore, inner);
    __syncthreads();
    probs_and_ds<T, R>(scores, dp, G::kLdScore, lse_rows, dot_rows, scale, q0, k0, s.seq,
                       doc_starts, b, static_cast<T*>(nullptr), ds, G::kLdProb);
    __syncthreads();
    block_mm<T, R, DP, false, false, true>(ds, G::kLdProb, k_tile, G::kLdOperand, dq_acc, G::kLdAcc,
                                           R);
  }
  __syncthreads();
  store_rows<T, DP>(dq, dq_acc, G::kLdAcc, scale, s, b, q0, h, s.heads, R);
}

// Grid (tiles, heads, batch); checks the limits of the y and z dimensions.
dim3 attention_grid(int64_t tiles, int64_t heads, int64_t batch) {
  SY_CHECK_MSG(tiles <= INT32_MAX && heads <= 65535 && batch <= 65535,
               "attention: shape exceeds the CUDA grid");
  return dim3(static_cast<unsigned int>(tiles), static_cast<unsigned int>(heads),
              static_cast<unsigned int>(batch));
}

float attention_scale(const AttentionShape& s) {
  return 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}

// Launches a tile kernel with `bytes` of dynamic shared memory, more than the default
// 48 KiB, which each kernel must be allowed before its launch.
template <typename Kernel, typename... Args>
void launch_tiles(Kernel kernel, size_t bytes, dim3 grid, cudaStream_t stream, Args... args) {
  int device = 0, max_bytes = 0;
  SY_CUDA_CHECK(cudaGetDevice(&device));
  SY_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SY_CHECK_MSG(bytes <= static_cast<size_t>(max_bytes),
               "attention: the CUDA kernels need more shared memory per block than this GPU has");
  SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  kernel<<<grid, kAttentionThreads, bytes, stream>>>(args...);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T, int DP>
void forward_tiles(const T* q, const T* k, const T* v, const AttentionShape& s,
                   const int32_t* doc_starts, T* out, float* lse, cudaStream_t stream) {
  const int64_t tiles = (s.seq + Tile<T, DP>::kRows - 1) / Tile<T, DP>::kRows;
  launch_tiles(attention_forward_kernel<T, DP>, ForwardLayout<T, DP>::kBytes,
               attention_grid(tiles, s.heads, s.batch), stream, q, k, v, s, doc_starts,
               attention_scale(s), out, lse);
}

template <typename T, int DP>
void backward_tiles(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                    const float* row_dots, const AttentionShape& s, const int32_t* doc_starts,
                    T* dq, T* dk, T* dv, cudaStream_t stream) {
  const int64_t tiles = (s.seq + Tile<T, DP>::kRows - 1) / Tile<T, DP>::kRows;
  const float scale = attention_scale(s);
  launch_tiles(attention_dkv_kernel<T, DP>, DkvLayout<T, DP>::kBytes,
               attention_grid(tiles, s.kv_heads, s.batch), stream, dout, q, k, v, lse, row_dots, s,
               doc_starts, scale, dk, dv);
  launch_tiles(attention_dq_kernel<T, DP>, DqLayout<T, DP>::kBytes,
               attention_grid(tiles, s.heads, s.batch), stream, dout, q, k, v, lse, row_dots, s,
               doc_starts, scale, dq);
}

void check_head_dim(const AttentionShape& s) {
  SY_CHECK_MSG(s.head_dim >= 1 && s.head_dim <= kAttentionMaxHeadDim,
               "attention: the CUDA kernels take head_dim from 1 to 128");
}

}  // namespace

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, const AttentionShape& s,
                       const int32_t* doc_starts, T* out, float* lse, cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  check_head_dim(s);
  if (s.head_dim <= 64)
    forward_tiles<T, 64>(q, k, v, s, doc_starts, out, lse, stream);
  else
    forward_tiles<T, 128>(q, k, v, s, doc_starts, out, lse, stream);
}

template <typename T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const AttentionShape& s, const int32_t* doc_starts,
                        T* dq, T* dk, T* dv, cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  check_head_dim(s);
  const int64_t rows = s.batch * s.seq * s.heads;
  Scratch<float> row_dots(rows, stream);
  constexpr int kRowsPerBlock = kAttentionThreads / 32;
  const int64_t blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1 << 16);
  attention_row_dots_kernel<T><<<static_cast<unsigned int>(blocks), kAttentionThreads, 0, stream>>>(
      dout, out, s, row_dots.get());
  SY_CUDA_CHECK_LAUNCH();
  if (s.head_dim <= 64)
    backward_tiles<T, 64>(dout, q, k, v, lse, row_dots.get(), s, doc_starts, dq, dk, dv, stream);
  else
    backward_tiles<T, 128>(dout, q, k, v, lse, row_dots.get(), s, doc_starts, dq, dk, dv, stream);
}

#define SY_INSTANTIATE_ATTENTION(T)                                                           \
  template void attention_forward<T>(const T*, const T*, const T*, const AttentionShape&,     \
                                     const int32_t*, T*, float*, cudaStream_t);               \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*,       \
                                      const float*, const AttentionShape&, const int32_t*, T*, \
                                      T*, T*, cudaStream_t);
SY_INSTANTIATE_ATTENTION(float)
SY_INSTANTIATE_ATTENTION(__nv_bfloat16)
#undef SY_INSTANTIATE_ATTENTION

}  // namespace switchyard::cuda
