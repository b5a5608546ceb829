#include "kernels/permute.h"

#include <initializer_list>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/permute.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/permute.h"
#endif

namespace switchyard {
namespace {

// Every dest row is -1 (dropped) or a row of the permuted buffer; checked here so a
// bad plan fails loudly instead of writing out of bounds. (The CUDA kernels check the
// rows they read on the device.)
void check_dest_rows(const Tensor& dest_rows, int64_t permuted_rows, const char* message) {
  const int32_t* dest = dest_rows.data<int32_t>();
  for (int64_t a = 0; a < dest_rows.numel(); ++a) {
    SY_CHECK_MSG(dest[a] >= -1 && dest[a] < permuted_rows, message);
  }
}

// The rows an op moves share one dtype, f32 or bf16.
void check_rows(std::initializer_list<const Tensor*> rows, const char* message) {
  const DType dtype = (*rows.begin())->dtype();
  bool ok = dtype == DType::kF32 || dtype == DType::kBF16;
  for (const Tensor* t : rows) ok = ok && t->dtype() == dtype;
  SY_CHECK_MSG(ok, message);
}

}  // namespace

// On CUDA, expert_ids, weights and dest_rows are device tensors; tokens_per_expert may be
// a device tensor or a host one. A host one is filled before the call returns (waiting for
// the plan), since the caller needs the counts to size the permuted buffer and as the
// grouped GEMMs' host group sizes.
void permute_plan(Device& dev, const Tensor& expert_ids, const Tensor& weights, int num_experts,
                  int64_t capacity, Tensor& tokens_per_expert, Tensor& dest_rows) {
  SY_CHECK_MSG(expert_ids.rank() == 2, "permute_plan: expert_ids must be (n, k)");
  SY_CHECK_MSG(weights.shape() == expert_ids.shape(), "permute_plan: weights must be (n, k)");
  SY_CHECK_MSG(num_experts >= 1, "permute_plan: num_experts must be positive");
  SY_CHECK_MSG(tokens_per_expert.shape() == Shape({num_experts}),
               "permute_plan: tokens_per_expert must be (E)");
  SY_CHECK_MSG(dest_rows.shape() == expert_ids.shape(), "permute_plan: dest_rows must be (n, k)");
  SY_CHECK_MSG(expert_ids.numel() <= INT32_MAX, "permute_plan: too many assignments for i32 rows");
  const int64_t n = expert_ids.dim(0);
  const int k = static_cast<int>(expert_ids.dim(1));
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    const bool counts_on_host = !tokens_per_expert.device().is_cuda();
    Tensor counts = counts_on_host
                        ? Tensor::empty({num_experts}, DType::kI32, MemoryKind::kOther, dev)
                        : tokens_per_expert;
    cuda::permute_plan(
        expert_ids.data<int32_t>(), weights.data<float>(), n, k, num_experts, capacity,
        counts.data<int32_t>(), dest_rows.data<int32_t>(),
        op_stream(dev, "permute_plan", {&expert_ids, &weights, &counts, &dest_rows}));
    if (counts_on_host) tokens_per_expert.copy_from(counts);
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "permute_plan: this build has no CUDA backend");
  const int32_t* ids = expert_ids.data<int32_t>();
  for (int64_t a = 0; a < expert_ids.numel(); ++a) {
    SY_CHECK_MSG(ids[a] >= -1 && ids[a] < num_experts, "permute_plan: expert id out of range");
  }
  cpu::permute_plan(ids, weights.data<float>(), n, k, num_experts, capacity,
                    tokens_per_expert.data<int32_t>(), dest_rows.data<int32_t>());
}

void regroup_received_rows(Device& dev, const Tensor& counts, Tensor& regroup) {
  SY_CHECK_MSG(counts.dtype() == DType::kI32 && counts.rank() == 2,
               "regroup_received_rows: counts must be i32 (sources, experts)");
  SY_CHECK_MSG(counts.numel() <= kMaxRegroupCounts, "regroup_received_rows: too many counts");
  SY_CHECK_MSG(regroup.dtype() == DType::kI32 && regroup.rank() == 2 && regroup.dim(1) == 1 &&
                   regroup.rows() <= INT32_MAX,
               "regroup_received_rows: regroup must be i32 (R, 1)");
  const int sources = static_cast<int>(counts.dim(0)), experts = static_cast<int>(counts.dim(1));
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda::regroup_received_rows(counts.data<int32_t>(), sources, experts, regroup.rows(),
                                regroup.data<int32_t>(),
                                op_stream(dev, "regroup_received_rows", {&counts, &regroup}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "regroup_received_rows: this build has no CUDA backend");
  const int32_t* c = counts.data<int32_t>();
  int64_t total = 0;
  for (int64_t i = 0; i < counts.numel(); ++i) {
    SY_CHECK_MSG(c[i] >= 0, "regroup_received_rows: a negative count");
    total += c[i];
  }
  SY_CHECK_MSG(total == regroup.rows(), "regroup_received_rows: the counts do not add up to R");
  // Each (source, expert) block's first place in expert-then-source order.
  std::vector<int64_t> base(counts.numel());
  int64_t place = 0;
  for (int e = 0; e < experts; ++e)
    for (int i = 0; i < sources; ++i) {
      base[i * experts + e] = place;
      place += c[i * experts + e];
    }
  int32_t* out = regroup.data<int32_t>();
  int64_t r = 0;
  for (int64_t b = 0; b < counts.numel(); ++b)
    for (int32_t q = 0; q < c[b]; ++q) out[r++] = static_cast<int32_t>(base[b] + q);
}

void permute_gather(Device& dev, const Tensor& x, const Tensor& dest_rows, Tensor& xp) {
  check_rows({&x, &xp}, "permute_gather: x and xp must be both f32 or both bf16");
  SY_CHECK_MSG(x.rank() == 2, "permute_gather: x must be (n, H)");
  SY_CHECK_MSG(
      dest_rows.dtype() == DType::kI32 && dest_rows.rank() == 2 && dest_rows.dim(0) == x.dim(0),
      "permute_gather: dest_rows must be i32 (n, k)");
  SY_CHECK_MSG(xp.rank() == 2 && xp.dim(1) == x.dim(1), "permute_gather: xp must be (R, H)");
  const int k = static_cast<int>(dest_rows.dim(1));
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "permute_gather", {&x, &dest_rows, &xp});
    with_cuda_type(x, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::permute_gather<T>(cuda_data<T>(x), dest_rows.data<int32_t>(), cuda_data<T>(xp),
                              x.dim(0), k, x.dim(1), xp.dim(0), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "permute_gather: this build has no CUDA backend");
  check_dest_rows(dest_rows, xp.dim(0), "permute_gather: dest row outside xp");
  // A gather only copies rows, so bf16 rows move as they are (no rounding to do).
  if (x.dtype() == DType::kBF16) {
    cpu::permute_gather(x.data<bf16>(), dest_rows.data<int32_t>(), xp.data<bf16>(), x.dim(0), k,
                        x.dim(1));
    return;
  }
  cpu::permute_gather(x.data<float>(), dest_rows.data<int32_t>(), xp.data<float>(), x.dim(0), k,
                      x.dim(1));
}

void permute_gather_backward(Device& dev, const Tensor& dxp, const Tensor& dest_rows, Tensor& dx) {
  check_rows({&dxp, &dx}, "permute_gather_backward: dxp and dx must be both f32 or both bf16");
  SY_CHECK_MSG(dx.rank() == 2, "permute_gather_backward: dx must be (n, H)");
  SY_CHECK_MSG(
      dest_rows.dtype() == DType::kI32 && dest_rows.rank() == 2 && dest_rows.dim(0) == dx.dim(0),
      "permute_gather_backward: dest_rows must be i32 (n, k)");
  SY_CHECK_MSG(dxp.rank() == 2 && dxp.dim(1) == dx.dim(1),
               "permute_gather_backward: dxp must be (R, H)");
  const int k = static_cast<int>(dest_rows.dim(1));
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "permute_gather_backward", {&dxp, &dest_rows, &dx});
    with_cuda_type(dx, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::permute_gather_backward<T>(cuda_data<T>(dxp), dest_rows.data<int32_t>(),
                                       cuda_data<T>(dx), dx.dim(0), k, dx.dim(1), dxp.dim(0),
                                       stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "permute_gather_backward: this build has no CUDA backend");
  if (dx.dtype() == DType::kBF16) {
    Tensor sums = widened(dx);
    permute_gather_backward(dev, widened(dxp), dest_rows, sums);
    store(dev, sums, dx);
    return;
  }
  check_dest_rows(dest_rows, dxp.dim(0), "permute_gather_backward: dest row outside dxp");
  cpu::permute_gather_backward(dxp.data<float>(), dest_rows.data<int32_t>(), dx.data<float>(),
                               dx.dim(0), k, dx.dim(1));
}

void unpermute_combine(Device& dev, const Tensor& yp, const Tensor& dest_rows,
                       const Tensor& weights, Tensor& y) {
  check_rows({&yp, &y}, "unpermute_combine: yp and y must be both f32 or both bf16");
  SY_CHECK_MSG(y.rank() == 2, "unpermute_combine: y must be (n, H)");
  SY_CHECK_MSG(
      dest_rows.dtype() == DType::kI32 && dest_rows.rank() == 2 && dest_rows.dim(0) == y.dim(0),
      "unpermute_combine: dest_rows must be i32 (n, k)");
  SY_CHECK_MSG(weights.dtype() == DType::kF32 && weights.shape() == dest_rows.shape(),
               "unpermute_combine: weights must be f32 (n, k)");
  SY_CHECK_MSG(yp.rank() == 2 && yp.dim(1) == y.dim(1), "unpermute_combine: yp must be (R, H)");
  const int k = static_cast<int>(dest_rows.dim(1));
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "unpermute_combine", {&yp, &dest_rows, &weights, &y});
    with_cuda_type(y, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::unpermute_combine<T>(cuda_data<T>(yp), dest_rows.data<int32_t>(), weights.data<float>(),
                                 cuda_data<T>(y), y.dim(0), k, y.dim(1), yp.dim(0), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "unpermute_combine: this build has no CUDA backend");
  if (y.dtype() == DType::kBF16) {
    Tensor result = f32_result(y);
    unpermute_combine(dev, widened(yp), dest_rows, weights, result);
    store(dev, result, y);
    return;
  }
  check_dest_rows(dest_rows, yp.dim(0), "unpermute_combine: dest row outside yp");
  cpu::unpermute_combine(yp.data<float>(), dest_rows.data<int32_t>(), weights.data<float>(),
                         y.data<float>(), y.dim(0), k, y.dim(1));
}

void unpermute_combine_backward(Device& dev, const Tensor& dy, const Tensor& yp,
                                const Tensor& dest_rows, const Tensor& weights, Tensor& dyp,
                                Tensor& dweights) {
  check_rows({&dy, &yp, &dyp},
             "unpermute_combine_backward: dy, yp and dyp must be all f32 or all bf16");
  SY_CHECK_MSG(dy.rank() == 2, "unpermute_combine_backward: dy must be (n, H)");
  SY_CHECK_MSG(
      dest_rows.dtype() == DType::kI32 && dest_rows.rank() == 2 && dest_rows.dim(0) == dy.dim(0),
      "unpermute_combine_backward: dest_rows must be i32 (n, k)");
  SY_CHECK_MSG(weights.dtype() == DType::kF32 && weights.shape() == dest_rows.shape(),
               "unpermute_combine_backward: weights must be f32 (n, k)");
  SY_CHECK_MSG(dweights.dtype() == DType::kF32 && dweights.shape() == dest_rows.shape(),
               "unpermute_combine_backward: dweights must be f32 (n, k)");
  SY_CHECK_MSG(yp.rank() == 2 && yp.dim(1) == dy.dim(1),
               "unpermute_combine_backward: yp must be (R, H)");
  SY_CHECK_MSG(dyp.shape() == yp.shape(), "unpermute_combine_backward: dyp must be (R, H)");
  const int k = static_cast<int>(dest_rows.dim(1));
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "unpermute_combine_backward",
                                    {&dy, &yp, &dest_rows, &weights, &dyp, &dweights});
    with_cuda_type(dy, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::unpermute_combine_backward<T>(
          cuda_data<T>(dy), cuda_data<T>(yp), dest_rows.data<int32_t>(), weights.data<float>(),
          cuda_data<T>(dyp), dweights.data<float>(), dy.dim(0), k, dy.dim(1), yp.dim(0), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "unpermute_combine_backward: this build has no CUDA backend");
  if (dyp.dtype() == DType::kBF16) {
    Tensor result = f32_result(dyp);
    unpermute_combine_backward(dev, widened(dy), widened(yp), dest_rows, weights, result, dweights);
    store(dev, result, dyp);
    return;
  }
  check_dest_rows(dest_rows, yp.dim(0), "unpermute_combine_backward: dest row outside yp");
  cpu::unpermute_combine_backward(dy.data<float>(), yp.data<float>(), dest_rows.data<int32_t>(),
                                  weights.data<float>(), dyp.data<float>(), dweights.data<float>(),
                                  dy.dim(0), k, dy.dim(1), yp.dim(0));
}

}  // namespace switchyard
