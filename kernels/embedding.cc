#include "kernels/embedding.h"

#include "kernels/cpu/embedding.h"

namespace switchyard {
namespace {

void check_ids(const Tensor& ids, int64_t vocab) {
  SY_CHECK_MSG(ids.dtype() == DType::kI32 && ids.rank() == 1, "embedding: ids must be i32 (n)");
  const int32_t* p = ids.data<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    SY_CHECK_MSG(p[t] >= -1 && p[t] < vocab, "embedding: token id outside the vocabulary");
  }
}

}  // namespace

void embedding_forward(Device& dev, const Tensor& ids, const Tensor& table, Tensor& out) {
  SY_CHECK_MSG(!dev.is_cuda(), "embedding_forward: no CUDA implementation yet");
  SY_CHECK_MSG(table.rank() == 2, "embedding_forward: table must be (vocab, hidden)");
  check_ids(ids, table.dim(0));
  const int64_t n = ids.numel(), hidden = table.dim(1);
  SY_CHECK_MSG(out.numel() == n * hidden && out.dim(-1) == hidden,
               "embedding_forward: out must be (n, hidden)");
  cpu::embedding_forward<float>(ids.data<int32_t>(), table.data<float>(), n, hidden,
                                out.data<float>());
}

void embedding_backward(Device& dev, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  SY_CHECK_MSG(!dev.is_cuda(), "embedding_backward: no CUDA implementation yet");
  SY_CHECK_MSG(dtable.rank() == 2, "embedding_backward: dtable must be (vocab, hidden)");
  check_ids(ids, dtable.dim(0));
  const int64_t n = ids.numel(), hidden = dtable.dim(1);
  SY_CHECK_MSG(dout.numel() == n * hidden && dout.dim(-1) == hidden,
               "embedding_backward: dout must be (n, hidden)");
  cpu::embedding_backward<float>(ids.data<int32_t>(), dout.data<float>(), n, hidden,
                                 dtable.data<float>());
}

}  // namespace switchyard
