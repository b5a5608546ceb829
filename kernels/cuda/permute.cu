#include "kernels/cuda/permute.h"

#include <bit>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/radix_sort.cuh"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

// Sort key of a router weight: ascending keys are descending weights. -0 and +0 tie, as
// they compare equal, and NaN ties with -inf (both rank last), as on the CPU.
__device__ uint32_t descending_weight_key(float w) {
  if (isnan(w)) w = -INFINITY;
  if (w == 0.0f) w = 0.0f;
  const uint32_t bits = __float_as_uint(w);
  // Flipping the sign bit of positives and every bit of negatives orders floats as
  // unsigned integers; the final negation reverses that order.
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

__global__ void dispatch_keys_kernel(const int32_t* expert_ids, int64_t total, int num_experts,
                                     uint32_t* keys) {
  for (int64_t a = grid_start(); a < total; a += grid_stride()) {
    const int32_t id = expert_ids[a];
    SY_DEVICE_CHECK(id >= -1 && id < num_experts, "permute_plan: expert id out of range");
    keys[a] = id >= 0 ? static_cast<uint32_t>(id) : static_cast<uint32_t>(num_experts);
  }
}

__global__ void iota_kernel(int32_t* values, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) values[i] = static_cast<int32_t>(i);
}

// counts[key] += 1 for every key below num_bins (integer atomics: exact in any order).
__global__ void histogram_kernel(const uint32_t* keys, int64_t total, int num_bins,
                                 int32_t* counts) {
  for (int64_t a = grid_start(); a < total; a += grid_stride()) {
    if (keys[a] < static_cast<uint32_t>(num_bins)) atomicAdd(&counts[keys[a]], 1);
  }
}

// (expert key, weight rank key) in one 64-bit key.
__global__ void ranked_keys_kernel(const uint32_t* keys, const float* weights, int64_t total,
                                   uint64_t* ranked) {
  for (int64_t a = grid_start(); a < total; a += grid_stride())
    ranked[a] = (static_cast<uint64_t>(keys[a]) << 32) | descending_weight_key(weights[a]);
}

// begin[e] = counts[0] + ... + counts[e-1]; experts are few, one thread suffices.
__global__ void exclusive_scan_kernel(const int32_t* counts, int num_experts, int32_t* begin) {
  int32_t sum = 0;
  for (int e = 0; e < num_experts; ++e) {
    begin[e] = sum;
    sum += counts[e];
  }
}

// Position i of the ranked order is rank i - begin[e] within its expert e; ranks at or
// past the capacity are dropped (their key becomes E).
__global__ void drop_over_capacity_kernel(const uint64_t* sorted_ranked,
                                          const int32_t* sorted_assignments, const int32_t* begin,
                                          int64_t total, int num_experts, int64_t capacity,
                                          uint32_t* keys) {
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const uint32_t e = static_cast<uint32_t>(sorted_ranked[i] >> 32);
    if (e < static_cast<uint32_t>(num_experts) && i - begin[e] >= capacity)
      keys[sorted_assignments[i]] = static_cast<uint32_t>(num_experts);
  }
}

// Kept assignments sort first, by expert, so a kept one's sorted position is its row.
__global__ void dest_rows_kernel(const uint32_t* sorted_keys, const int32_t* sorted_assignments,
                                 int64_t total, int num_experts, int32_t* dest_rows) {
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    dest_rows[sorted_assignments[i]] =
        sorted_keys[i] < static_cast<uint32_t>(num_experts) ? static_cast<int32_t>(i) : -1;
  }
}

__device__ int32_t checked_row(const int32_t* dest_rows, int64_t a, int64_t permuted_rows) {
  const int32_t row = dest_rows[a];
  SY_DEVICE_CHECK(row >= -1 && row < permuted_rows, "permute: dest row outside the buffer");
  return row;
}

template <typename T>
__global__ void permute_gather_kernel(const T* x, const int32_t* dest_rows, T* xp, int64_t n, int k,
                                      int64_t hidden, int64_t permuted_rows) {
  for (int64_t p = grid_start(); p < n * k * hidden; p += grid_stride()) {
    const int64_t a = p / hidden;
    const int32_t row = checked_row(dest_rows, a, permuted_rows);
    if (row >= 0) xp[row * hidden + p % hidden] = x[(a / k) * hidden + p % hidden];
  }
}

template <typename T>
__global__ void permute_gather_backward_kernel(const T* dxp, const int32_t* dest_rows, T* dx,
                                               int64_t n, int k, int64_t hidden,
                                               int64_t permuted_rows) {
  for (int64_t p = grid_start(); p < n * hidden; p += grid_stride()) {
    const int64_t t = p / hidden;
    float acc = static_cast<float>(dx[p]);
    for (int j = 0; j < k; ++j) {
      const int32_t row = checked_row(dest_rows, t * k + j, permuted_rows);
      if (row >= 0) acc += static_cast<float>(dxp[row * hidden + p % hidden]);
    }
    dx[p] = static_cast<T>(acc);
  }
}

template <typename T>
__global__ void unpermute_combine_kernel(const T* yp, const int32_t* dest_rows,
                                         const float* weights, T* y, int64_t n, int k,
                                         int64_t hidden, int64_t permuted_rows) {
  for (int64_t p = grid_start(); p < n * hidden; p += grid_stride()) {
    const int64_t t = p / hidden;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t row = checked_row(dest_rows, t * k + j, permuted_rows);
      if (row >= 0) acc += weights[t * k + j] * static_cast<float>(yp[row * hidden + p % hidden]);
    }
    y[p] = static_cast<T>(acc);
  }
}

// One block per assignment (the row is the same for the whole block, so the branch and
// the block sum are uniform).
template <typename T>
__global__ void unpermute_combine_backward_kernel(const T* dy, const T* yp,
                                                  const int32_t* dest_rows, const float* weights,
                                                  T* dyp, float* dweights, int64_t n, int k,
                                                  int64_t hidden, int64_t permuted_rows) {
  for (int64_t a = blockIdx.x; a < n * k; a += gridDim.x) {
    const int32_t row = checked_row(dest_rows, a, permuted_rows);
    if (row < 0) {
      if (threadIdx.x == 0) dweights[a] = 0.0f;
      continue;
    }
    const float w = weights[a];
    const T* dyt = dy + (a / k) * hidden;
    const T* src = yp + row * hidden;
    T* dst = dyp + row * hidden;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
      const float d = static_cast<float>(dyt[c]);
      dst[c] = static_cast<T>(w * d);
      dot += d * static_cast<float>(src[c]);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dweights[a] = dot;
  }
}

constexpr int kRegroupMaxCounts = 4096;

__global__ void regroup_kernel(const int32_t* counts, int sources, int experts, int64_t rows,
                               int32_t* regroup) {
  __shared__ int32_t start[kRegroupMaxCounts + 1];  // each block's first received row
  __shared__ int32_t base[kRegroupMaxCounts];       // its first place in expert order
  const int blocks = sources * experts;
  if (threadIdx.x == 0) {
    int64_t place = 0;
    for (int e = 0; e < experts; ++e)
      for (int i = 0; i < sources; ++i) {
        const int32_t c = counts[i * experts + e];
        SY_DEVICE_CHECK(c >= 0, "regroup_received_rows: a negative count");
        base[i * experts + e] = static_cast<int32_t>(place);
        place += c;
      }
    SY_DEVICE_CHECK(place == rows, "regroup_received_rows: the counts do not add up to R");
    int32_t at = 0;
    for (int b = 0; b < blocks; ++b) {
      start[b] = at;
      at += counts[b];
    }
    start[blocks] = at;
  }
  __syncthreads();
  for (int64_t r = grid_start(); r < rows; r += grid_stride()) {
    int lo = 0, hi = blocks;  // start[lo] <= r < start[hi]; empty blocks are passed over
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (start[mid] <= r)
        lo = mid;
      else
        hi = mid;
    }
    regroup[r] = base[lo] + static_cast<int32_t>(r - start[lo]);
  }
}

}  // namespace

void regroup_received_rows(const int32_t* counts, int sources, int experts, int64_t rows,
                           int32_t* regroup, cudaStream_t stream) {
  SY_CHECK_MSG(static_cast<int64_t>(sources) * experts <= kRegroupMaxCounts,
               "regroup_received_rows: too many counts");
  if (rows == 0) return;
  SY_CHECK_MSG(sources * experts > 0, "regroup_received_rows: rows but no counts");
  regroup_kernel<<<grid_blocks(rows), kThreads, 0, stream>>>(counts, sources, experts, rows,
                                                             regroup);
  SY_CUDA_CHECK_LAUNCH();
}

void permute_plan(const int32_t* expert_ids, const float* weights, int64_t n, int k,
                  int num_experts, int64_t capacity, int32_t* tokens_per_expert, int32_t* dest_rows,
                  cudaStream_t stream) {
  const int64_t total = n * k;
  SY_CUDA_CHECK(cudaMemsetAsync(tokens_per_expert, 0, num_experts * sizeof(int32_t), stream));
  if (total == 0) return;
  const unsigned int blocks = grid_blocks(total);
  // Keys lie in [0, E].
  const int expert_bits = std::bit_width(static_cast<uint32_t>(num_experts));

  Scratch<uint32_t> keys(total, stream), sorted_keys(total, stream);
  Scratch<int32_t> assignments(total, stream), sorted_assignments(total, stream);
  dispatch_keys_kernel<<<blocks, kThreads, 0, stream>>>(expert_ids, total, num_experts, keys.get());
  SY_CUDA_CHECK_LAUNCH();
  iota_kernel<<<blocks, kThreads, 0, stream>>>(assignments.get(), total);
  SY_CUDA_CHECK_LAUNCH();

  if (capacity >= 0) {
    Scratch<uint64_t> ranked(total, stream), sorted_ranked(total, stream);
    Scratch<int32_t> counts(num_experts, stream), begin(num_experts, stream);
    ranked_keys_kernel<<<blocks, kThreads, 0, stream>>>(keys.get(), weights, total, ranked.get());
    SY_CUDA_CHECK_LAUNCH();
    sort_pairs(ranked.get(), sorted_ranked.get(), assignments.get(), sorted_assignments.get(),
               total, 32 + expert_bits, stream);
    SY_CUDA_CHECK(cudaMemsetAsync(counts.get(), 0, num_experts * sizeof(int32_t), stream));
    histogram_kernel<<<blocks, kThreads, 0, stream>>>(keys.get(), total, num_experts, counts.get());
    SY_CUDA_CHECK_LAUNCH();
    exclusive_scan_kernel<<<1, 1, 0, stream>>>(counts.get(), num_experts, begin.get());
    SY_CUDA_CHECK_LAUNCH();
    drop_over_capacity_kernel<<<blocks, kThreads, 0, stream>>>(
        sorted_ranked.get(), sorted_assignments.get(), begin.get(), total, num_experts, capacity,
        keys.get());
    SY_CUDA_CHECK_LAUNCH();
  }

  sort_pairs(keys.get(), sorted_keys.get(), assignments.get(), sorted_assignments.get(), total,
             expert_bits, stream);
  histogram_kernel<<<blocks, kThreads, 0, stream>>>(keys.get(), total, num_experts,
                                                    tokens_per_expert);
  SY_CUDA_CHECK_LAUNCH();
  dest_rows_kernel<<<blocks, kThreads, 0, stream>>>(sorted_keys.get(), sorted_assignments.get(),
                                                    total, num_experts, dest_rows);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void permute_gather(const T* x, const int32_t* dest_rows, T* xp, int64_t n, int k, int64_t hidden,
                    int64_t permuted_rows, cudaStream_t stream) {
  const int64_t items = n * k * hidden;
  if (items == 0) return;
  permute_gather_kernel<<<grid_blocks(items), kThreads, 0, stream>>>(x, dest_rows, xp, n, k, hidden,
                                                                     permuted_rows);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void permute_gather_backward(const T* dxp, const int32_t* dest_rows, T* dx, int64_t n, int k,
                             int64_t hidden, int64_t permuted_rows, cudaStream_t stream) {
  if (n * hidden == 0) return;
  permute_gather_backward_kernel<<<grid_blocks(n * hidden), kThreads, 0, stream>>>(
      dxp, dest_rows, dx, n, k, hidden, permuted_rows);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void unpermute_combine(const T* yp, const int32_t* dest_rows, const float* weights, T* y, int64_t n,
                       int k, int64_t hidden, int64_t permuted_rows, cudaStream_t stream) {
  if (n * hidden == 0) return;
  unpermute_combine_kernel<<<grid_blocks(n * hidden), kThreads, 0, stream>>>(
      yp, dest_rows, weights, y, n, k, hidden, permuted_rows);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename T>
void unpermute_combine_backward(const T* dy, const T* yp, const int32_t* dest_rows,
                                const float* weights, T* dyp, float* dweights, int64_t n, int k,
                                int64_t hidden, int64_t permuted_rows, cudaStream_t stream) {
  if (permuted_rows * hidden > 0)
    SY_CUDA_CHECK(cudaMemsetAsync(dyp, 0, permuted_rows * hidden * sizeof(T), stream));
  if (n * k == 0) return;
  unpermute_combine_backward_kernel<<<grid_blocks(n * k, 1), kThreads, 0, stream>>>(
      dy, yp, dest_rows, weights, dyp, dweights, n, k, hidden, permuted_rows);
  SY_CUDA_CHECK_LAUNCH();
}

#define SY_INSTANTIATE_PERMUTE(T)                                                               \
  template void permute_gather<T>(const T*, const int32_t*, T*, int64_t, int, int64_t, int64_t, \
                                  cudaStream_t);                                                \
  template void permute_gather_backward<T>(const T*, const int32_t*, T*, int64_t, int, int64_t, \
                                           int64_t, cudaStream_t);                              \
  template void unpermute_combine<T>(const T*, const int32_t*, const float*, T*, int64_t, int,  \
                                     int64_t, int64_t, cudaStream_t);                           \
  template void unpermute_combine_backward<T>(const T*, const T*, const int32_t*, const float*, \
                                              T*, float*, int64_t, int, int64_t, int64_t,       \
                                              cudaStream_t);
SY_INSTANTIATE_PERMUTE(float)
SY_INSTANTIATE_PERMUTE(__nv_bfloat16)
#undef SY_INSTANTIATE_PERMUTE

}  // namespace switchyard::cuda
