#include "kernels/exact_grad.h"

#include "core/runtime/check.h"
#include "kernels/cpu/exact_grad.h"

namespace switchyard {
namespace {

// CHECKs the pairing of an f32 tensor with its ledger; returns the fault counts' cells.
int64_t* faults_of(Device& dev, const char* op, const Tensor& values, const Tensor& ledger) {
  SY_CHECK_MSG(!dev.is_cuda(), "exact gradient sums run on the CPU only");
  SY_CHECK_MSG(values.dtype() == DType::kF32 && ledger.dtype() == DType::kI64, op);
  SY_CHECK_MSG(ledger.numel() == exact_grad_ledger_size(values.numel()), op);
  return ledger.data<int64_t>() + 2 * values.numel();
}

}  // namespace

int64_t exact_grad_ledger_size(int64_t n) { return 2 * n + 2; }

void exact_grad_add(Device& dev, const Tensor& part, Tensor& ledger) {
  int64_t* cells = faults_of(dev, "exact_grad_add: an f32 part and its i64 ledger", part, ledger);
  cpu::ExactGradFaults faults{cells[0], cells[1]};
  cpu::exact_grad_add(part.data<float>(), ledger.data<int64_t>(), part.numel(), faults);
  cells[0] = faults.nan;
  cells[1] = faults.out_of_range;
}

void exact_grad_read(Device& dev, const Tensor& ledger, Tensor& out) {
  const int64_t* cells =
      faults_of(dev, "exact_grad_read: an i64 ledger and its f32 output", out, ledger);
  cpu::exact_grad_read(ledger.data<int64_t>(), {cells[0], cells[1]}, out.data<float>(),
                       out.numel());
}

}  // namespace switchyard
