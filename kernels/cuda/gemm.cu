#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <compare>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/scratch.h"

namespace switchyard::cuda {
namespace {

// cuBLASLt's workspace, for the algorithms that need one (split-K among them): the size
// the cuBLAS documentation recommends for Hopper (cublasSetWorkspace).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

struct Blas::State {
  // What the cuBLASLt plan of a product depends on: its row-major shape and types, and the
  // alignment of each pointer (the heuristic only offers algorithms that work at it).
  struct PlanKey {
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    cudaDataType_t ab, c;
    uint32_t align_a, align_b, align_c;
    auto operator<=>(const PlanKey&) const = default;
  };

  // The cuBLASLt descriptors of one product shape and the algorithm chosen for it.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C = D
    cublasLtMatmulAlgo_t algo{};

    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan() {
      if (c) SY_CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(c));
      if (b) SY_CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(b));
      if (a) SY_CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(a));
      if (desc) SY_CUBLASLT_CHECK(cublasLtMatmulDescDestroy(desc));
    }
  };

  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // kWorkspaceBytes, 256-byte aligned as cuBLASLt requires
  std::map<PlanKey, Plan> plans;
  // Pinned host memory for the grouped batched calls' pointer tables, and the event after
  // the last copy out of it.
  void* staging = nullptr;
  size_t staging_bytes = 0;
  cudaEvent_t staging_copied = nullptr;
};

Blas::Blas(cublasHandle_t handle, cudaStream_t stream)
    : handle_(handle), stream_(stream), state_(std::make_unique<State>()) {
  SY_CUBLASLT_CHECK(cublasLtCreate(&state_->lt));
  SY_CUDA_CHECK(cudaMalloc(&state_->workspace, kWorkspaceBytes));
  SY_CUDA_CHECK(cudaEventCreateWithFlags(&state_->staging_copied, cudaEventDisableTiming));
}

Blas::~Blas() {
  SY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  state_->plans.clear();
  if (state_->staging) SY_CUDA_CHECK(cudaFreeHost(state_->staging));
  SY_CUDA_CHECK(cudaEventDestroy(state_->staging_copied));
  SY_CUDA_CHECK(cudaFree(state_->workspace));
  SY_CUBLASLT_CHECK(cublasLtDestroy(state_->lt));
}

size_t Blas::cached_plans() const { return state_->plans.size(); }

namespace {

using PlanKey = Blas::State::PlanKey;
using Plan = Blas::State::Plan;

// c = beta * c over an (m, n) block with row stride ldc; 0 (not 0 * c) when beta is 0.
template <typename T>
__global__ void scale_matrix_kernel(T* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  for (int64_t p = grid_start(); p < m * n; p += grid_stride()) {
    T* x = c + (p / n) * ldc + p % n;
    *x = beta == 0.0f ? static_cast<T>(0.0f) : static_cast<T>(beta * static_cast<float>(*x));
  }
}

// c = bf16(beta * c + product) over an (m, n) block with row stride ldc: one rounding.
__global__ void accumulate_bf16_kernel(__nv_bfloat16* c, int64_t ldc, const float* product,
                                       int64_t m, int64_t n, float beta) {
  for (int64_t p = grid_start(); p < m * n; p += grid_stride()) {
    __nv_bfloat16* x = c + (p / n) * ldc + p % n;
    *x = __float2bfloat16(beta * __bfloat162float(*x) + product[p]);
  }
}

int64_t element_bytes(cudaDataType_t type) {
  SY_CHECK_MSG(type == CUDA_R_32F || type == CUDA_R_16BF, "gemm: f32 or bf16 operands only");
  return type == CUDA_R_32F ? 4 : 2;
}

const char* type_name(cudaDataType_t type) { return type == CUDA_R_32F ? "f32" : "bf16"; }

// `p` advanced by `elements` elements of `type`.
template <typename Pointer>
Pointer offset(Pointer p, int64_t elements, cudaDataType_t type) {
  using Byte =
      std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const char, char>;
  return static_cast<Byte*>(p) + elements * element_bytes(type);
}

// The largest power of two dividing `p`'s address, at most 256 (the alignment cuBLASLt
// assumes of every matrix unless told less).
uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return static_cast<uint32_t>(std::min<uintptr_t>(address & (~address + 1), 256));
}

void set_preference(cublasLtMatmulPreference_t preference,
                    cublasLtMatmulPreferenceAttributes_t attribute, const uint32_t& value) {
  SY_CUBLASLT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
}

// The plan of `key`, made on its first use: descriptors of cuBLAS's column-major view of
// the row-major product (see gemm()) and the heuristic's best algorithm for them.
const Plan& plan_for(Blas::State& state, const PlanKey& key) {
  // f32 expert products key on each expert's row count, which changes every step: past
  // kMaxPlans shapes the cache starts over rather than grow without bound.
  if (state.plans.size() >= Blas::kMaxPlans && !state.plans.contains(key)) state.plans.clear();
  auto [entry, added] = state.plans.try_emplace(key);
  Plan& plan = entry->second;
  if (!added) return plan;
  SY_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is b
  const int32_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // and its B is a
  SY_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  SY_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // A stored row-major (r, c) matrix with row stride ld is the column-major (c, r) one
  // with leading dimension ld.
  auto layout = [](cublasLtMatrixLayout_t* l, cudaDataType_t type, int64_t rows, int64_t cols,
                   int64_t ld) {
    SY_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(l, type, static_cast<uint64_t>(cols),
                                                 static_cast<uint64_t>(rows), ld));
  };
  layout(&plan.a, key.ab, key.trans_b ? key.n : key.k, key.trans_b ? key.k : key.n, key.ldb);
  layout(&plan.b, key.ab, key.trans_a ? key.k : key.m, key.trans_a ? key.m : key.k, key.lda);
  layout(&plan.c, key.c, key.m, key.n, key.ldc);

  cublasLtMatmulPreference_t preference = nullptr;
  SY_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  SY_CUBLASLT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)));
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      state.lt, plan.desc, plan.a, plan.b, plan.c, plan.c, preference, 1, &result, &found);
  SY_CUBLASLT_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (status != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    const std::string message =
        std::string("gemm: cuBLASLt offers no algorithm for a") + (key.trans_a ? "^T" : "") + " (" +
        std::to_string(key.m) + " x " + std::to_string(key.k) + ") @ b" +
        (key.trans_b ? "^T" : "") + " (" + std::to_string(key.k) + " x " + std::to_string(key.n) +
        "), " + type_name(key.ab) + " operands, " + type_name(key.c) + " result, row strides " +
        std::to_string(key.lda) + "/" + std::to_string(key.ldb) + "/" + std::to_string(key.ldc) +
        ", alignments " + std::to_string(key.align_a) + "/" + std::to_string(key.align_b) + "/" +
        std::to_string(key.align_c) + " bytes (" +
        cublasLtGetStatusString(status == CUBLAS_STATUS_SUCCESS ? result.state : status) + ")";
    internal::check_failed(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", message.c_str());
  }
  plan.algo = result.algo;
  return plan;
}

// One product of a grouped batched call, row-major as gemm() takes it.
struct Product {
  int64_t m, n, k;
  const void* a;
  const void* b;
  void* c;
};

// What the products of one grouped call share: transposes, row strides and beta.
struct GroupedShape {
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;
  float beta;
};

// A grouped batched call cannot see its pointers (they are in device memory), so for
// bf16 operands the cuBLAS documentation asks of every one: 16-byte aligned where k
// elements take a multiple of 16 bytes, 4-byte aligned where they take a multiple of 4.
// The same is asked here for each matrix's own row stride, to stay on the safe side.
bool meets_grouped_alignment(const Product& p, const GroupedShape& shape, GemmTypes types) {
  if (types.ab != CUDA_R_16BF) return true;
  auto required = [](int64_t bytes) -> uintptr_t {
    return bytes % 16 == 0 ? 16 : bytes % 4 == 0 ? 4 : 1;
  };
  auto aligned = [&](const void* ptr, int64_t row_bytes) {
    const uintptr_t need = std::max(required(p.k * element_bytes(types.ab)), required(row_bytes));
    return reinterpret_cast<uintptr_t>(ptr) % need == 0;
  };
  return aligned(p.a, shape.lda * element_bytes(types.ab)) &&
         aligned(p.b, shape.ldb * element_bytes(types.ab)) &&
         aligned(p.c, shape.ldc * element_bytes(types.c));
}

// Runs `products` (none empty) in one cublasGemmGroupedBatchedEx call, in cuBLAS's
// column-major view as gemm() does; products of equal size form one cuBLAS group, and a
// product whose pointers fail meets_grouped_alignment() runs through gemm() instead.
void grouped_batched(Blas& blas, const GroupedShape& shape, const std::vector<Product>& products,
                     GemmTypes types) {
  std::vector<Product> batched;
  for (const Product& p : products) {
    if (meets_grouped_alignment(p, shape, types))
      batched.push_back(p);
    else
      gemm(blas, shape.trans_a, shape.trans_b, p.m, p.n, p.k, 1.0f, p.a, shape.lda, p.b, shape.ldb,
           shape.beta, p.c, shape.ldc, types);
  }
  if (batched.empty()) return;
  auto size_of = [](const Product& p) { return std::tie(p.m, p.n, p.k); };
  std::stable_sort(batched.begin(), batched.end(),
                   [&](const Product& x, const Product& y) { return size_of(x) < size_of(y); });

  // The device table: cuBLAS's A pointers (the b operands), its B pointers (the a
  // operands), then the C pointers, staged in pinned memory once the previous call's
  // copy out of it has run. One table of void* serves all three (cuBLAS only reads
  // through the A and B pointers).
  Blas::State& state = blas.state();
  const int64_t count = static_cast<int64_t>(batched.size());
  const size_t table_bytes = static_cast<size_t>(3 * count) * sizeof(void*);
  SY_CUDA_CHECK(cudaEventSynchronize(state.staging_copied));
  if (state.staging_bytes < table_bytes) {
    if (state.staging) SY_CUDA_CHECK(cudaFreeHost(state.staging));
    state.staging_bytes = std::max(table_bytes, 2 * state.staging_bytes);
    SY_CUDA_CHECK(cudaMallocHost(&state.staging, state.staging_bytes));
  }
  void** staged = static_cast<void**>(state.staging);
  const cublasOperation_t op_a = shape.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = shape.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  std::vector<cublasOperation_t> ops_a, ops_b;
  std::vector<int64_t> ms, ns, ks, ldas, ldbs, ldcs, group_sizes;
  std::vector<float> alphas, betas;
  for (int64_t i = 0; i < count; ++i) {
    const Product& p = batched[i];
    staged[i] = const_cast<void*>(p.b);
    staged[count + i] = const_cast<void*>(p.a);
    staged[2 * count + i] = p.c;
    if (i > 0 && size_of(p) == size_of(batched[i - 1])) {
      ++group_sizes.back();
      continue;
    }
    ops_a.push_back(op_a);
    ops_b.push_back(op_b);
    ms.push_back(p.n);
    ns.push_back(p.m);
    ks.push_back(p.k);
    ldas.push_back(shape.ldb);
    ldbs.push_back(shape.lda);
    ldcs.push_back(shape.ldc);
    alphas.push_back(1.0f);
    betas.push_back(shape.beta);
    group_sizes.push_back(1);
  }
  const Scratch<void*> table(3 * count, blas.stream());
  SY_CUDA_CHECK(
      cudaMemcpyAsync(table.get(), staged, table_bytes, cudaMemcpyHostToDevice, blas.stream()));
  SY_CUDA_CHECK(cudaEventRecord(state.staging_copied, blas.stream()));
  SY_CUBLAS_CHECK(cublasGemmGroupedBatchedEx_64(
      blas.handle(), ops_a.data(), ops_b.data(), ms.data(), ns.data(), ks.data(), alphas.data(),
      table.get(), types.ab, ldas.data(), table.get() + count, types.ab, ldbs.data(), betas.data(),
      table.get() + 2 * count, types.c, ldcs.data(), static_cast<int64_t>(group_sizes.size()),
      group_sizes.data(), CUBLAS_COMPUTE_32F));
}

}  // namespace

// cuBLAS is column-major: a row-major (r, c) matrix with row stride ld is its (c, r)
// transpose there. So row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, i.e. with the operands swapped and the same transpose flags.
void gemm(Blas& blas, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
          GemmTypes types) {
  element_bytes(types.ab);
  element_bytes(types.c);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // The product is empty (and cuBLAS rejects the zero leading dimensions an empty
    // operand brings): only the beta scaling remains.
    if (beta == 1.0f) return;
    if (types.c == CUDA_R_32F)
      scale_matrix_kernel<<<grid_blocks(m * n), kThreads, 0, blas.stream()>>>(
          static_cast<float*>(c), m, n, ldc, beta);
    else
      scale_matrix_kernel<<<grid_blocks(m * n), kThreads, 0, blas.stream()>>>(
          static_cast<__nv_bfloat16*>(c), m, n, ldc, beta);
    SY_CUDA_CHECK_LAUNCH();
    return;
  }
  if (types.c == CUDA_R_16BF && beta != 0.0f) {
    // cuBLASLt accumulating into a bf16 C rounds the product to bf16 before it adds
    // beta * C (seen on an H100: 0.25 for 0.2637 where a gradient cancels), two roundings
    // where the CPU makes one. The product goes to f32 scratch and one kernel adds it.
    const Scratch<float> product(m * n, blas.stream());
    gemm(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, 0.0f, product.get(), n,
         {types.ab, CUDA_R_32F});
    accumulate_bf16_kernel<<<grid_blocks(m * n), kThreads, 0, blas.stream()>>>(
        static_cast<__nv_bfloat16*>(c), ldc, product.get(), m, n, beta);
    SY_CUDA_CHECK_LAUNCH();
    return;
  }
  Blas::State& state = blas.state();
  const Plan& plan = plan_for(state, {trans_a, trans_b, m, n, k, lda, ldb, ldc, types.ab, types.c,
                                      alignment(a), alignment(b), alignment(c)});
  // In place: c is both cuBLASLt's C and its D.
  SY_CUBLASLT_CHECK(cublasLtMatmul(state.lt, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, c,
                                   plan.c, c, plan.c, &plan.algo, state.workspace, kWorkspaceBytes,
                                   blas.stream()));
}

void grouped_matmul_nt(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm(blas, false, true, host_sizes[g], n, k, 1.0f, offset(a, row * k, types.ab), k,
         offset(w, g * n * k, types.ab), k, 0.0f, offset(out, row * n, types.c), n, types);
    row += host_sizes[g];
  }
}

void grouped_matmul_nn(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                       int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm(blas, false, false, host_sizes[g], k, n, 1.0f, offset(a, row * n, types.ab), n,
         offset(w, g * n * k, types.ab), k, 0.0f, offset(out, row * k, types.c), k, types);
    row += host_sizes[g];
  }
}

void grouped_matmul_tn_accumulate(Blas& blas, const void* a, const void* b,
                                  const int32_t* host_sizes, int64_t groups, int64_t n, int64_t k,
                                  void* dw, GemmTypes types) {
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    gemm(blas, true, false, n, k, host_sizes[g], 1.0f, offset(a, row * n, types.ab), n,
         offset(b, row * k, types.ab), k, 1.0f, offset(dw, g * n * k, types.c), k, types);
    row += host_sizes[g];
  }
}

// The cuBLAS documentation's table for cublasGemmGroupedBatchedEx with
// CUBLAS_COMPUTE_32F lists f32 -> f32, bf16 -> bf16 and f16 -> f16 only.
bool grouped_batched_supports(GemmTypes types) {
  element_bytes(types.ab);
  element_bytes(types.c);
  return types.ab == types.c;
}

namespace {

// The non-empty groups' products: product(g, first row, rows) for each.
template <typename ProductOf>
std::vector<Product> group_products(const int32_t* host_sizes, int64_t groups,
                                    ProductOf product) {
  std::vector<Product> products;
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (host_sizes[g] > 0) products.push_back(product(g, row, host_sizes[g]));
    row += host_sizes[g];
  }
  return products;
}

}  // namespace

// A group without rows has no product (and adds nothing to its dw[g]).
void grouped_batched_matmul_nt(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                               int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types) {
  if (!grouped_batched_supports(types)) {
    grouped_matmul_nt(blas, a, w, host_sizes, groups, n, k, out, types);
    return;
  }
  grouped_batched(blas, {false, true, k, k, n, 0.0f},
                  group_products(host_sizes, groups,
                                 [&](int64_t g, int64_t row, int64_t rows) {
                                   return Product{rows, n, k, offset(a, row * k, types.ab),
                                                  offset(w, g * n * k, types.ab),
                                                  offset(out, row * n, types.c)};
                                 }),
                  types);
}

void grouped_batched_matmul_nn(Blas& blas, const void* a, const void* w, const int32_t* host_sizes,
                               int64_t groups, int64_t n, int64_t k, void* out, GemmTypes types) {
  if (!grouped_batched_supports(types)) {
    grouped_matmul_nn(blas, a, w, host_sizes, groups, n, k, out, types);
    return;
  }
  grouped_batched(blas, {false, false, n, k, k, 0.0f},
                  group_products(host_sizes, groups,
                                 [&](int64_t g, int64_t row, int64_t rows) {
                                   return Product{rows, k, n, offset(a, row * n, types.ab),
                                                  offset(w, g * n * k, types.ab),
                                                  offset(out, row * k, types.c)};
                                 }),
                  types);
}

void grouped_batched_matmul_tn_accumulate(Blas& blas, const void* a, const void* b,
                                          const int32_t* host_sizes, int64_t groups, int64_t n,
                                          int64_t k, void* dw, GemmTypes types) {
  // Into a bf16 dw, cuBLAS rounds each product to bf16 before it adds dw (gemm() above);
  // the loop's gemm() adds an f32 product with one rounding, as the CPU does.
  if (!grouped_batched_supports(types) || types.c == CUDA_R_16BF) {
    grouped_matmul_tn_accumulate(blas, a, b, host_sizes, groups, n, k, dw, types);
    return;
  }
  grouped_batched(blas, {true, false, n, k, k, 1.0f},
                  group_products(host_sizes, groups,
                                 [&](int64_t g, int64_t row, int64_t rows) {
                                   return Product{n, k, rows, offset(a, row * n, types.ab),
                                                  offset(b, row * k, types.ab),
                                                  offset(dw, g * n * k, types.c)};
                                 }),
                  types);
}

}  // namespace switchyard::cuda
