#include "kernels/embedding.h"

#include <cstdint>

#include "kernels/convert.h"
#include "kernels/cpu/embedding.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/embedding.h"
#endif

namespace switchyard {
namespace {

void check_ids_tensor(const Tensor& ids) {
  SY_CHECK_MSG(ids.dtype() == DType::kI32 && ids.rank() == 1, "embedding: ids must be i32 (n)");
  SY_CHECK_MSG(ids.numel() <= INT32_MAX, "embedding: too many tokens for i32 indices");
}

// Ids lie in [-1, vocab) (-1: a row another rank holds); checked here on the CPU, on the
// device by the CUDA kernels.
void check_id_values(const Tensor& ids, int64_t vocab) {
  const int32_t* p = ids.data<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    SY_CHECK_MSG(p[t] >= -1 && p[t] < vocab, "embedding: token id outside the vocabulary");
  }
}

}  // namespace

void embedding_forward(Device& dev, const Tensor& ids, const Tensor& table, Tensor& out) {
  SY_CHECK_MSG(is_float(table) && out.dtype() == table.dtype(),
               "embedding_forward: table and out must be both f32 or both bf16");
  SY_CHECK_MSG(table.rank() == 2, "embedding_forward: table must be (vocab, hidden)");
  check_ids_tensor(ids);
  const int64_t n = ids.numel(), vocab = table.dim(0), hidden = table.dim(1);
  SY_CHECK_MSG(out.numel() == n * hidden && out.dim(-1) == hidden,
               "embedding_forward: out must be (n, hidden)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "embedding_forward", {&ids, &table, &out});
    with_cuda_type(table, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::embedding_forward(ids.data<int32_t>(), cuda_data<T>(table), n, vocab, hidden,
                              cuda_data<T>(out), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "embedding_forward: this build has no CUDA backend");
  check_id_values(ids, vocab);
  // A gather does no arithmetic, so bf16 rows are copied as they are: the bits widening,
  // copying and rounding would store, without widening the whole table.
  if (table.dtype() == DType::kBF16) {
    cpu::embedding_forward<bf16>(ids.data<int32_t>(), table.data<bf16>(), n, hidden,
                                 out.data<bf16>());
    return;
  }
  cpu::embedding_forward<float>(ids.data<int32_t>(), table.data<float>(), n, hidden,
                                out.data<float>());
}

void embedding_backward(Device& dev, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  SY_CHECK_MSG(is_float(dout) && dtable.dtype() == DType::kF32,
               "embedding_backward: dout must be f32 or bf16, dtable f32");
  SY_CHECK_MSG(dtable.rank() == 2, "embedding_backward: dtable must be (vocab, hidden)");
  check_ids_tensor(ids);
  const int64_t n = ids.numel(), vocab = dtable.dim(0), hidden = dtable.dim(1);
  SY_CHECK_MSG(dout.numel() == n * hidden && dout.dim(-1) == hidden,
               "embedding_backward: dout must be (n, hidden)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "embedding_backward", {&ids, &dout, &dtable});
    with_cuda_type(dout, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::embedding_backward(ids.data<int32_t>(), cuda_data<T>(dout), n, vocab, hidden,
                               dtable.data<float>(), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "embedding_backward: this build has no CUDA backend");
  if (any_bf16({&dout})) {
    embedding_backward(dev, ids, widened(dout), dtable);
    return;
  }
  check_id_values(ids, vocab);
  cpu::embedding_backward<float>(ids.data<int32_t>(), dout.data<float>(), n, hidden,
                                 dtable.data<float>());
}

}  // namespace switchyard
