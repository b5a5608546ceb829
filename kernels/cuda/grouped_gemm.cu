#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

// One block scans the sizes, kScanThreads groups at a time.
constexpr int kScanThreads = 256;

__global__ void group_layout_kernel(const int32_t* sizes, int64_t groups, int64_t rows,
                                    int tile_rows, int32_t* offsets, int32_t* tile_starts) {
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  int64_t row_base = 0, tile_base = 0;  // the sums over the chunks before, in every thread
  for (int64_t first = 0; first < groups; first += kScanThreads) {
    const int64_t g = first + threadIdx.x;
    const int64_t size = g < groups ? sizes[g] : 0;
    SY_DEVICE_CHECK(size >= 0, "grouped matmul: negative group size");
    int64_t row_offset, row_total, tile_offset, tile_total;
    Scan(temp).ExclusiveSum(size, row_offset, row_total);
    __syncthreads();  // before the second scan reuses `temp`
    Scan(temp).ExclusiveSum((size + tile_rows - 1) / tile_rows, tile_offset, tile_total);
    __syncthreads();  // before the next chunk's
    if (g < groups) {
      offsets[g] = static_cast<int32_t>(row_base + row_offset);
      tile_starts[g] = static_cast<int32_t>(tile_base + tile_offset);
    }
    row_base += row_total;
    tile_base += tile_total;
  }
  if (threadIdx.x == 0) {
    SY_DEVICE_CHECK(row_base <= rows, "grouped matmul: group sizes add up to more than the rows");
    offsets[groups] = static_cast<int32_t>(row_base);
    tile_starts[groups] = static_cast<int32_t>(tile_base);
  }
}

// Host sizes reach the device as a launch argument, which the launch copies: unlike
// cudaMemcpyAsync from pageable memory, that neither waits for the stream nor leaves the
// host memory in use. Chunks keep each launch's arguments under 4 KB.
constexpr int kSizesPerLaunch = 960;

struct SizesChunk {
  int32_t values[kSizesPerLaunch];
};

__global__ void store_sizes_kernel(SizesChunk chunk, int count, int32_t* sizes) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) sizes[i] = chunk.values[i];
}

// The device offsets (G + 1 entries) then row tile starts (G + 1) of the groups, at
// `layout`, which has room for 3 G + 2 entries: host sizes are staged in the last G.
void lay_out_groups(GroupSizes sizes, int64_t groups, int64_t rows, int tile_rows, int32_t* layout,
                    cudaStream_t stream) {
  const int32_t* device_sizes = sizes.sizes;
  if (sizes.on_host) {
    int32_t* staged = layout + 2 * (groups + 1);
    for (int64_t first = 0; first < groups; first += kSizesPerLaunch) {
      const int count = static_cast<int>(std::min<int64_t>(kSizesPerLaunch, groups - first));
      SizesChunk chunk;
      std::memcpy(chunk.values, sizes.sizes + first, count * sizeof(int32_t));
      store_sizes_kernel<<<1, kScanThreads, 0, stream>>>(chunk, count, staged + first);
      SY_CUDA_CHECK_LAUNCH();
    }
    device_sizes = staged;
  }
  group_layout(device_sizes, groups, rows, tile_rows, layout, layout + groups + 1, stream);
}

// The products. A block computes one kBM x kBN output tile with 8 warps in a 2 x 4
// layout, each warp 64 x 32 outputs as 4 x 2 WMMA fragments (bf16 16x16x16, f32
// accumulators), over the reduction in kBK slices. The operand slices are staged in
// shared memory in their global layout (global reads are 16-byte chunks along the
// contiguous dimension), double-buffered: the next slice's copies (cp.async) are issued
// before the current slice's products, with one barrier per slice. Out-of-range rows and
// columns (group ends, N and K tails) are staged as zeros, so they add nothing.
// Performance limits: mma.sync through WMMA, without Hopper's wgmma and TMA or a deeper
// pipeline, stays well under cuBLAS on large groups; shapes with N or K not a multiple of
// 8 take the slower element-wise reads; and a tn block reduces over all of its group's
// rows alone (no split over the rows), so a large group's blocks finish last.
constexpr int kBM = kGroupedTileRows;  // output tile rows
constexpr int kBN = 128;               // output tile columns
constexpr int kBK = 32;                // reduction slice per stage
constexpr int kGemmThreads = 256;
constexpr int kWarpRows = 64, kWarpCols = 32;
constexpr int kFrag = 16;
// 8 bf16 of padding after each staged row: the row strides become 80 and 272 bytes, which
// keeps WMMA's fragments 32-byte aligned and puts the eight 16-byte rows that a fragment
// load reads at once in distinct banks.
constexpr int kPad = 8;
// Row stride of the per-warp f32 staging of one fragment in the epilogue.
constexpr int kOutStride = kFrag + 4;

static_assert(kGemmThreads / 32 == (kBM / kWarpRows) * (kBN / kWarpCols));

// Copies a Rows x Cols tile of a row-major matrix in global memory into shared memory
// laid out as [Rows][Cols + kPad].
template <int Rows, int Cols>
struct Stager {
  static constexpr int kStride = Cols + kPad;
  static constexpr int kElements = Rows * kStride;
  static constexpr int kChunksPerRow = Cols / 8;                       // 16-byte chunks
  static constexpr int kChunks = Rows * kChunksPerRow / kGemmThreads;  // per thread
  static_assert(Rows * kChunksPerRow % kGemmThreads == 0);

  // Element (r, c) of the tile is m[(row0 + r) * ld + col0 + c], or zero at or past row
  // `row_end` or column `col_end`. With Vector (m 16-byte aligned, ld a multiple of 8 and
  // col_end == ld, as for every operand here) a chunk lies wholly inside the columns or
  // past them, since col0 is a multiple of 8: it is one asynchronous 16-byte copy
  // (cp.async; zero-filled outside), complete after __pipeline_wait_prior(0). Otherwise
  // the elements are read one by one and stored at once.
  template <bool Vector>
  __device__ static void copy(bf16* tile, const bf16* m, int ld, int row0, int row_end, int col0,
                              int col_end) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = threadIdx.x + i * kGemmThreads;
      const int row = row0 + c / kChunksPerRow;
      const int col = col0 + c % kChunksPerRow * 8;
      bf16* dst = tile + c / kChunksPerRow * kStride + c % kChunksPerRow * 8;
      const bool inside = row < row_end && col < col_end;
      const bf16* src = inside ? m + static_cast<int64_t>(row) * ld + col : m;
      if constexpr (Vector) {
        __pipeline_memcpy_async(dst, src, 16, inside ? 0 : 16);
      } else {
        uint32_t words[4] = {0, 0, 0, 0};  // little-endian: the lower address in the low half
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (inside && col + e < col_end)
            words[e / 2] |= static_cast<uint32_t>(__bfloat16_as_ushort(src[e])) << (16 * (e % 2));
        }
        *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
  }
};

// The three products as one GEMM per tile, C (M x C) = A (M x D) @ B (D x C):
//   nt: C = out rows of the group x N, D = K; A = a rows, B[d][c] = w[g][c][d]
//   nn: C = out rows of the group x K, D = N; A = a rows, B[d][c] = w[g][d][c]
//   tn: C = dw[g] (N x K),             D = the group's rows; A[m][d] = a[d][m], B = b rows
enum class Variant { kNT, kNN, kTN };

template <typename Out>
struct GemmArgs {
  const bf16* a;
  const bf16* b;  // w (nt, nn) or b (tn)
  Out* out;
  const int32_t* offsets;      // G + 1 row offsets
  const int32_t* tile_starts;  // G + 1 first row tiles (nt, nn)
  int groups, n, k;
  int row_tiles;  // output row tiles per group (tn)
  int col_tiles;  // output column tiles
};

// Vector: both operands are copied in 16-byte chunks (Stager::copy).
template <Variant V, bool Vector, typename Out>
__global__ void __launch_bounds__(kGemmThreads, 2) grouped_gemm_kernel(GemmArgs<Out> p) {
  constexpr bool kARowMajor = V != Variant::kTN;  // A contiguous along D, else along M
  constexpr bool kBRowMajor = V != Variant::kNT;  // B contiguous along C, else along D
  using AStager = Stager<kARowMajor ? kBM : kBK, kARowMajor ? kBK : kBM>;
  using BStager = Stager<kBRowMajor ? kBK : kBN, kBRowMajor ? kBN : kBK>;
  using ALayout = std::conditional_t<kARowMajor, wmma::row_major, wmma::col_major>;
  using BLayout = std::conditional_t<kBRowMajor, wmma::row_major, wmma::col_major>;
  constexpr int kStageElements = AStager::kElements + BStager::kElements;
  constexpr int kOperandBytes = 2 * kStageElements * static_cast<int>(sizeof(bf16));
  constexpr int kEpilogueBytes =
      kGemmThreads / 32 * kFrag * kOutStride * static_cast<int>(sizeof(float));
  // The epilogue's staging reuses the operand stages once the products are done.
  __shared__ __align__(
      128) unsigned char smem[kOperandBytes > kEpilogueBytes ? kOperandBytes : kEpilogueBytes];

  // The block's tile: output rows [m0, m_end) clipped to the tile, columns from c0,
  // reduction over [d_begin, d_end). nt, nn: rows of the group's row tile (offsets into
  // out's rows); tn: rows of dw[g].
  int group, m0, m_end, c0, d_begin, d_end;
  const int block = static_cast<int>(blockIdx.x);
  if constexpr (V == Variant::kTN) {
    const int tiles = p.row_tiles * p.col_tiles;
    group = block / tiles;
    m0 = block % tiles / p.col_tiles * kBM;
    c0 = block % tiles % p.col_tiles * kBN;
    m_end = p.n;
    d_begin = p.offsets[group];
    d_end = p.offsets[group + 1];
    if (d_begin == d_end) return;  // dw[g] += 0: left untouched
  } else {
    // The grid has a row tile slot for every possible tile; the real ones come first.
    const int slot = block / p.col_tiles;
    c0 = block % p.col_tiles * kBN;
    if (slot >= p.tile_starts[p.groups]) return;
    // The group holding the slot: tile_starts[lo] <= slot < tile_starts[hi] throughout,
    // and groups without rows (tile_starts[g] == tile_starts[g + 1]) are passed over.
    int lo = 0, hi = p.groups;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (p.tile_starts[mid] <= slot)
        lo = mid;
      else
        hi = mid;
    }
    group = lo;
    m0 = p.offsets[group] + (slot - p.tile_starts[group]) * kBM;
    m_end = p.offsets[group + 1];
    d_begin = 0;
    d_end = V == Variant::kNT ? p.k : p.n;
  }
  const int c_end = V == Variant::kNT ? p.n : p.k;  // output columns, out's row stride
  const int lda = V == Variant::kNT ? p.k : p.n;
  const int64_t matrix = static_cast<int64_t>(p.n) * p.k;          // elements of w[g], dw[g]
  const bf16* b = V == Variant::kTN ? p.b : p.b + group * matrix;  // row stride k
  Out* out = V == Variant::kTN ? p.out + group * matrix : p.out;

  auto a_tile = [&](int stage) {
    return reinterpret_cast<bf16*>(smem) + stage % 2 * kStageElements;
  };
  auto b_tile = [&](int stage) { return a_tile(stage) + AStager::kElements; };
  // Starts the copies of reduction slice `stage` into its buffer.
  auto copy = [&](int stage) {
    const int d0 = d_begin + stage * kBK;
    if constexpr (kARowMajor)
      AStager::template copy<Vector>(a_tile(stage), p.a, lda, m0, m_end, d0, d_end);
    else
      AStager::template copy<Vector>(a_tile(stage), p.a, lda, d0, d_end, m0, m_end);
    if constexpr (kBRowMajor)
      BStager::template copy<Vector>(b_tile(stage), b, p.k, d0, d_end, c0, c_end);
    else
      BStager::template copy<Vector>(b_tile(stage), b, p.k, c0, c_end, d0, d_end);
    __pipeline_commit();
  };

  const int warp = threadIdx.x / 32;
  const int warp_m = warp / (kBN / kWarpCols) * kWarpRows;
  const int warp_c = warp % (kBN / kWarpCols) * kWarpCols;
  constexpr int kFragRows = kWarpRows / kFrag, kFragCols = kWarpCols / kFrag;
  wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc[kFragRows][kFragCols];
#pragma unroll
  for (int i = 0; i < kFragRows; ++i)
#pragma unroll
    for (int j = 0; j < kFragCols; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int stages = (d_end - d_begin + kBK - 1) / kBK;
  if (stages > 0) copy(0);
  __pipeline_wait_prior(0);
  __syncthreads();
  for (int s = 0; s < stages; ++s) {
    // Slice s + 1 goes to the buffer slice s - 1 was read from: every warp has passed the
    // barrier after that slice's products.
    if (s + 1 < stages) copy(s + 1);
    const bf16* at = a_tile(s);
    const bf16* bt = b_tile(s);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += kFrag) {
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, BLayout> b_frag[kFragCols];
#pragma unroll
      for (int j = 0; j < kFragCols; ++j) {
        const int c = warp_c + j * kFrag;
        if constexpr (kBRowMajor)
          wmma::load_matrix_sync(b_frag[j], bt + kk * BStager::kStride + c, BStager::kStride);
        else
          wmma::load_matrix_sync(b_frag[j], bt + c * BStager::kStride + kk, BStager::kStride);
      }
#pragma unroll
      for (int i = 0; i < kFragRows; ++i) {
        const int m = warp_m + i * kFrag;
        wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, ALayout> a_frag;
        if constexpr (kARowMajor)
          wmma::load_matrix_sync(a_frag, at + m * AStager::kStride + kk, AStager::kStride);
        else
          wmma::load_matrix_sync(a_frag, at + kk * AStager::kStride + m, AStager::kStride);
#pragma unroll
        for (int j = 0; j < kFragCols; ++j) wmma::mma_sync(acc[i][j], a_frag, b_frag[j], acc[i][j]);
      }
    }
    __pipeline_wait_prior(0);
    __syncthreads();
  }

  // Each warp stores its fragments one at a time through its own f32 staging (the
  // fragments' register layout is unspecified), then each lane writes 8 consecutive
  // elements of one fragment row, converted, within the tile's bounds.
  float* staging = reinterpret_cast<float*>(smem) + warp * kFrag * kOutStride;
  const int lane = threadIdx.x % 32;
  const int lane_row = lane / 2, lane_col = lane % 2 * 8;
#pragma unroll
  for (int i = 0; i < kFragRows; ++i) {
#pragma unroll
    for (int j = 0; j < kFragCols; ++j) {
      wmma::store_matrix_sync(staging, acc[i][j], kOutStride, wmma::mem_row_major);
      __syncwarp();
      const int row = m0 + warp_m + i * kFrag + lane_row;
      const int col = c0 + warp_c + j * kFrag + lane_col;
      if (row < m_end) {
        Out* o = out + static_cast<int64_t>(row) * c_end + col;
        const float* v = staging + lane_row * kOutStride + lane_col;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (col + e >= c_end) continue;
          if constexpr (V == Variant::kTN)
            o[e] = static_cast<Out>(static_cast<float>(o[e]) + v[e]);
          else
            o[e] = static_cast<Out>(v[e]);
        }
      }
      __syncwarp();  // before the next fragment overwrites the staging
    }
  }
}

template <Variant V, typename Out>
void grouped_gemm(const bf16* a, const bf16* b, GroupSizes sizes, int64_t rows, int64_t groups,
                  int64_t n, int64_t k, Out* out, cudaStream_t stream) {
  SY_CHECK_MSG(groups > 0 || rows == 0, "grouped matmul: rows but no groups");
  // The kernel's indices are 32-bit (its addresses 64-bit), with a tile to spare.
  constexpr int64_t kMaxDim = INT_MAX - std::max(kBM, kBN);
  SY_CHECK_MSG(rows <= kMaxDim && groups <= kMaxDim && n <= kMaxDim && k <= kMaxDim,
               "grouped matmul: a dimension exceeds the kernel's 32-bit indices");
  const int64_t out_rows = V == Variant::kTN ? n : rows;  // tn: per group
  const int64_t out_cols = V == Variant::kNT ? n : k;
  if (groups == 0 || rows == 0 || out_rows == 0 || out_cols == 0) return;

  Scratch<int32_t> layout(3 * groups + 2, stream);
  lay_out_groups(sizes, groups, rows, kBM, layout.get(), stream);

  GemmArgs<Out> args;
  args.a = a;
  args.b = b;
  args.out = out;
  args.offsets = layout.get();
  args.tile_starts = layout.get() + groups + 1;
  args.groups = static_cast<int>(groups);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  args.row_tiles = static_cast<int>((out_rows + kBM - 1) / kBM);
  args.col_tiles = static_cast<int>((out_cols + kBN - 1) / kBN);
  // tn: every group's tiles of dw[g]; nt, nn: the row tiles of all groups number at most
  // sum(ceil(s_g / kBM)) <= ceil(R / kBM) + G, a bound known without the sizes.
  const int64_t row_slots =
      V == Variant::kTN ? groups * args.row_tiles : (rows + kBM - 1) / kBM + groups;
  const int64_t blocks = row_slots * args.col_tiles;
  SY_CHECK_MSG(blocks <= INT_MAX, "grouped matmul: too many tiles for one launch");
  // 16-byte reads need both operands' row strides (a: k or n; w, b: k) to be multiples of
  // 8 elements from 16-byte aligned starts; model shapes are, the element-wise reads are
  // for the others.
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const unsigned int grid = static_cast<unsigned int>(blocks);
  if (n % 8 == 0 && k % 8 == 0 && aligned(a) && aligned(b))
    grouped_gemm_kernel<V, true, Out><<<grid, kGemmThreads, 0, stream>>>(args);
  else
    grouped_gemm_kernel<V, false, Out><<<grid, kGemmThreads, 0, stream>>>(args);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void group_layout(const int32_t* sizes, int64_t groups, int64_t rows, int tile_rows,
                  int32_t* offsets, int32_t* tile_starts, cudaStream_t stream) {
  SY_CHECK_MSG(tile_rows > 0, "group_layout: tile_rows must be positive");
  group_layout_kernel<<<1, kScanThreads, 0, stream>>>(sizes, groups, rows, tile_rows, offsets,
                                                      tile_starts);
  SY_CUDA_CHECK_LAUNCH();
}

template <typename Out>
void grouped_gemm_nt(const bf16* a, const bf16* w, GroupSizes sizes, int64_t rows, int64_t groups,
                     int64_t n, int64_t k, Out* out, cudaStream_t stream) {
  grouped_gemm<Variant::kNT>(a, w, sizes, rows, groups, n, k, out, stream);
}

template <typename Out>
void grouped_gemm_nn(const bf16* a, const bf16* w, GroupSizes sizes, int64_t rows, int64_t groups,
                     int64_t n, int64_t k, Out* out, cudaStream_t stream) {
  grouped_gemm<Variant::kNN>(a, w, sizes, rows, groups, n, k, out, stream);
}

template <typename Out>
void grouped_gemm_tn_accumulate(const bf16* a, const bf16* b, GroupSizes sizes, int64_t rows,
                                int64_t groups, int64_t n, int64_t k, Out* dw,
                                cudaStream_t stream) {
  grouped_gemm<Variant::kTN>(a, b, sizes, rows, groups, n, k, dw, stream);
}

#define SY_INSTANTIATE_GROUPED_GEMM(Out)                                                       \
  template void grouped_gemm_nt<Out>(const bf16*, const bf16*, GroupSizes, int64_t, int64_t,   \
                                     int64_t, int64_t, Out*, cudaStream_t);                    \
  template void grouped_gemm_nn<Out>(const bf16*, const bf16*, GroupSizes, int64_t, int64_t,   \
                                     int64_t, int64_t, Out*, cudaStream_t);                    \
  template void grouped_gemm_tn_accumulate<Out>(const bf16*, const bf16*, GroupSizes, int64_t, \
                                                int64_t, int64_t, int64_t, Out*, cudaStream_t);
SY_INSTANTIATE_GROUPED_GEMM(float)
SY_INSTANTIATE_GROUPED_GEMM(bf16)
#undef SY_INSTANTIATE_GROUPED_GEMM

}  // namespace switchyard::cuda
