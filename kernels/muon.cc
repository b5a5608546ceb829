#include "kernels/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/muon.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/muon.h"
#endif

namespace switchyard {
namespace {

void check_f32(const char* op, std::initializer_list<const Tensor*> tensors, int64_t n) {
  for (const Tensor* t : tensors) {
    SY_CHECK_MSG(t->dtype() == DType::kF32, op);
    SY_CHECK_MSG(t->numel() == n, op);
  }
}

// The iterations on one normalised matrix x (rows, cols); `spare` has its shape, `gram`
// and `poly` are (side, side) with side = min(rows, cols).
void newton_schulz(Device& dev, const NewtonSchulz& ns, Tensor& x, Tensor& spare, Tensor& gram,
                   Tensor& poly) {
  const bool tall = x.dim(0) > x.dim(1);
  Tensor* current = &x;
  Tensor* next = &spare;
  for (int step = 0; step < ns.steps; ++step) {
    // A = X X^T on the wide orientation: X^T X for a tall X.
    matmul(dev, *current, tall, *current, !tall, gram);
    // B = b A + c A A.
    matmul(dev, gram, false, gram, false, poly, ns.c);
    add_(dev, poly, gram, ns.b);
    // X = a X + B X; for a tall X that is X^T = a X^T + B X^T, so X = a X + X B^T.
    if (tall) matmul(dev, *current, false, poly, true, *next);
    else matmul(dev, poly, false, *current, false, *next);
    add_(dev, *next, *current, ns.a);
    std::swap(current, next);
  }
  if (current != &x) x.copy_from(*current);
}

}  // namespace

void muon_momentum(Device& dev, float mu, bool nesterov, float grad_scale, const Tensor& grad,
                   Tensor& momentum, Tensor& input) {
  const int64_t n = grad.numel();
  check_f32("muon_momentum: grad, momentum and input are f32 with one element count",
            {&grad, &momentum, &input}, n);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "muon_momentum", {&grad, &momentum, &input});
    cuda::muon_momentum(grad.data<float>(), momentum.data<float>(), input.data<float>(), n, mu,
                        nesterov, grad_scale, stream);
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "muon_momentum: this build has no CUDA backend");
  cpu::muon_momentum(grad.data<float>(), momentum.data<float>(), input.data<float>(), n, mu,
                     nesterov, grad_scale);
}

void muon_orthogonalize(Device& dev, const NewtonSchulz& ns, Tensor& x, int64_t rows,
                        int64_t cols) {
  SY_CHECK_MSG(x.dtype() == DType::kF32, "muon_orthogonalize: x is f32");
  SY_CHECK_MSG(rows > 0 && cols > 0 && x.numel() % (rows * cols) == 0,
               "muon_orthogonalize: x must hold whole (rows, cols) matrices");
  const int64_t count = x.numel() / (rows * cols);
  const Tensor matrices = x.reshape({count, rows, cols});
  std::vector<Tensor> each;
  for (int64_t m = 0; m < count; ++m)
    each.push_back(matrices.slice_rows(m, m + 1).reshape({rows, cols}));
  // One wait for the host on CUDA, for every matrix's norm.
  const std::vector<double> squares = sum_squares(dev, each);
  const int64_t side = std::min(rows, cols);
  Tensor gram = Tensor::empty({side, side}, DType::kF32, MemoryKind::kOther, dev);
  Tensor poly = Tensor::empty({side, side}, DType::kF32, MemoryKind::kOther, dev);
  Tensor spare = Tensor::empty({rows, cols}, DType::kF32, MemoryKind::kOther, dev);
  for (size_t m = 0; m < each.size(); ++m) {
    scale_(dev, each[m], static_cast<float>(1.0 / (std::sqrt(squares[m]) + ns.eps)));
    newton_schulz(dev, ns, each[m], spare, gram, poly);
  }
}

double muon_update_scale(double update_rms, int64_t rows, int64_t cols) {
  return update_rms * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

void muon_apply(Device& dev, double lr, double weight_decay, double scale, Tensor& param,
                const Tensor& update, Tensor* work) {
  const int64_t n = param.numel();
  check_f32("muon_apply: param and update are f32 with one element count", {&param, &update},
            n);
  SY_CHECK_MSG(!work || (work->dtype() == DType::kBF16 && work->numel() == n),
               "muon_apply: a working copy is bf16 and matches param");
  const auto decay = static_cast<float>(1.0 - lr * weight_decay);
  const auto step = static_cast<float>(lr * scale);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "muon_apply", {&param, &update});
    if (work) op_stream(dev, "muon_apply", {work});
    cuda::muon_apply(param.data<float>(), update.data<float>(), work ? work->raw_data() : nullptr,
                     n, decay, step, stream);
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "muon_apply: this build has no CUDA backend");
  cpu::muon_apply(param.data<float>(), update.data<float>(), n, decay, step);
  if (work) convert(dev, param, *work);
}

}  // namespace switchyard
