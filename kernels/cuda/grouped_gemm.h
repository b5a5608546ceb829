// The engine's grouped matrix products on tensor cores, for bf16 operands with f32
// accumulation: the same products as the cuBLASLt loop of kernels/cuda/gemm.h, but one
// launch for all groups, whose row offsets are read from device memory. The group sizes
// never travel to the host, so nothing waits for the stream and a CUDA graph can capture
// the products. Every output element is computed by one block in a fixed order
// (deterministic); `Out` (float or __nv_bfloat16) is the result's element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchyard::cuda {

// The G sizes of the groups (i32): in memory of the device the products run on, or in
// host memory, which is passed to the device inside a kernel launch (the host memory is
// free again at once and nothing waits for the stream).
struct GroupSizes {
  const int32_t* sizes = nullptr;
  bool on_host = false;
};

// Rows of the output tiles of grouped_matmul_nt and _nn (a row tile never spans two
// groups, so a group of s rows takes ceil(s / kGroupedTileRows) of them).
inline constexpr int kGroupedTileRows = 128;

// Scans device group sizes: offsets[g] = sizes[0] + ... + sizes[g-1] and tile_starts[g]
// the same sum of ceil(sizes[h] / tile_rows), for g = 0..G (G + 1 entries each, device
// memory). A negative size, or sizes adding up to more than `rows`, trap on the device.
void group_layout(const int32_t* sizes, int64_t groups, int64_t rows, int tile_rows,
                  int32_t* offsets, int32_t* tile_starts, cudaStream_t stream);

// Group g owns rows [offsets[g], offsets[g + 1]) of the row-blocked operands (R rows);
// rows past offsets[G] are neither read nor written.
// out_g = a_g @ w[g]^T; a: (R, K), w: (G, N, K), out: (R, N), written.
template <typename Out>
void grouped_gemm_nt(const __nv_bfloat16* a, const __nv_bfloat16* w, GroupSizes sizes, int64_t rows,
                     int64_t groups, int64_t n, int64_t k, Out* out, cudaStream_t stream);
// out_g = a_g @ w[g]; a: (R, N), w: (G, N, K), out: (R, K), written.
template <typename Out>
void grouped_gemm_nn(const __nv_bfloat16* a, const __nv_bfloat16* w, GroupSizes sizes, int64_t rows,
                     int64_t groups, int64_t n, int64_t k, Out* out, cudaStream_t stream);
// dw[g] += a_g^T @ b_g; a: (R, N), b: (R, K), dw: (G, N, K), accumulated (a group with no
// rows leaves its dw[g] untouched).
template <typename Out>
void grouped_gemm_tn_accumulate(const __nv_bfloat16* a, const __nv_bfloat16* b, GroupSizes sizes,
                                int64_t rows, int64_t groups, int64_t n, int64_t k, Out* dw,
                                cudaStream_t stream);

}  // namespace switchyard::cuda
