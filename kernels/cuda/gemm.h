// CUDA matrix products (twins of kernels/cpu/gemm.h) with fp32 compute, on the stream of a
// device's Blas: single products through cuBLASLt; the grouped products of the expert FFN
// as one such product per group, or as one cuBLAS grouped batched call. Row-major
// operands of f32 or bf16: a and b share one type, c may be the other (bf16 operands with
// an f32 result give the router and LM-head logits and the weight gradients; f32
// accumulation either way).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace switchyard::cuda {

struct GemmTypes {
  cudaDataType_t ab = CUDA_R_32F;  // CUDA_R_32F or CUDA_R_16BF
  cudaDataType_t c = CUDA_R_32F;
};

// What the products of one device run with, all on its stream: the cuBLAS handle bound
// to it, a cuBLASLt handle and its workspace, the cuBLASLt plan (descriptors and the
// heuristic's algorithm) of every product shape met so far, so the heuristic runs once
// per shape, and the pinned memory the grouped batched calls stage their pointer tables
// in. A CudaDevice owns one (kernels/cuda/cuda_device.h); one thread uses it at a time.
class Blas {
 public:
  // `handle` is bound to `stream`, and both outlive this object.
  Blas(cublasHandle_t handle, cudaStream_t stream);
  // Waits for the stream first: queued products may still use the workspace.
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cublasHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }

  struct State;  // kernels/cuda/gemm.cu
  State& state() { return *state_; }
  // The cuBLASLt plans held (one per product shape and alignment), at most kMaxPlans.
  size_t cached_plans() const;
  static constexpr size_t kMaxPlans = 1024;

 private:
  cublasHandle_t handle_;
  cudaStream_t stream_;
  std::unique_ptr<State> state_;
};

// c = alpha * op(a) @ op(b) + beta * c with op(a): (m, k), op(b): (k, n), c: (m, n); lda,
// ldb, ldc are the row strides of the stored (untransposed) matrices. With beta == 0, c
// is only written (stale NaNs there do not propagate). The algorithm is chosen for the
// pointers' actual alignment, so operands may start anywhere in a tensor (row slices).
void gemm(Blas& blas, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
          GemmTypes types);

// Grouped products, one gemm() per non-empty group. `host_sizes` is host memory:
// the row offsets decide the pointers of each call.
// out_g = a_g @ w[g]^T; a: (R, K), w: (G, N, K), out: (R, N), written.
void grouped_matmul_nt(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types);
// out_g = a_g @ w[g]; a: (R, N), w: (G, N, K), out: (R, K), written.
void grouped_matmul_nn(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types);
// dw[g] += a_g^T @ b_g; a: (R, N), b: (R, K), dw: (G, N, K), accumulated (a group with no
// rows leaves its dw[g] untouched).
void grouped_matmul_tn_accumulate(Blas& blas, const void* a, const void* b,
                                  const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k,
                                  void* dw, GemmTypes types);

// Whether cublasGemmGroupedBatchedEx takes these types with fp32 compute: f32 operands
// and result, or bf16 operands and result; not bf16 operands with an f32 result.
bool grouped_batched_supports(GemmTypes types);

// The same grouped products as one cublasGemmGroupedBatchedEx call, in which the
// non-empty groups of equal size form one cuBLAS group. Not used in training:
// bench/gpu_ops.cc measures it against the tensor-core kernel and the per-group loop.
// The operand pointers reach the device as one table per call, copied on the stream
// from pinned staging memory, which the next call reuses once that copy has run (so the
// host runs at most one grouped batched call ahead of the stream). Types it does not
// support run the per-group loop above instead; so do the groups whose bf16 pointers
// lack the alignment cuBLAS asks for (see grouped_batched in gemm.cu), and
// tn_accumulate into a bf16 dw (cuBLAS would round each product to bf16 before adding).
void grouped_batched_matmul_nt(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                               int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types);
void grouped_batched_matmul_nn(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                               int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types);
void grouped_batched_matmul_tn_accumulate(Blas& blas, const void* a, const void* b,
                                          const int32_t* host_sizes, int64_t groups, int64_t n,
                                          int64_t k, void* dw, GemmTypes types);

}  // namespace switchyard::cuda
