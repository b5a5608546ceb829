#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/rope.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/rope.h"
#endif

namespace switchyard {
namespace {

void check_rope_operands(const char* op, const Tensor& table, const Tensor& x) {
  SY_CHECK_MSG(x.rank() == 4 && (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16), op);
  SY_CHECK_MSG(table.dtype() == DType::kF32, "rope: the table must be f32");
  SY_CHECK_MSG(x.dim(3) % 2 == 0, "rope: head_dim must be even");
  SY_CHECK_MSG(table.rank() == 3 && table.dim(0) >= x.dim(1) && table.dim(1) == x.dim(3) / 2 &&
                   table.dim(2) == 2,
               "rope: table does not cover (seq, head_dim/2, 2)");
}

#ifdef SWITCHYARD_WITH_CUDA
// x rotated in place on the device (the inverse rotation for the backward).
void cuda_rope_rotate(const Tensor& table, Tensor& x, bool inverse, cudaStream_t stream) {
  with_cuda_type(x, [&](auto type) {
    using T = typename decltype(type)::type;
    cuda::rope_rotate(table.data<float>(), cuda_data<T>(x), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                      inverse, stream);
  });
}
#endif

}  // namespace

Tensor rope_table(int64_t seq, int64_t head_dim, float theta) {
  SY_CHECK_MSG(seq >= 0 && head_dim > 0 && head_dim % 2 == 0,
               "rope_table: head_dim must be positive and even");
  Tensor table = Tensor::empty({seq, head_dim / 2, 2});
  cpu::rope_table<float>(seq, head_dim, theta, table.data<float>());
  return table;
}

double yarn_mscale(double scale, double k) {
  return scale <= 1 ? 1.0 : 0.1 * k * std::log(scale) + 1.0;
}

namespace {

// The (fractional) channel pair whose wavelength fits `rotations` times into the
// original context: d ln(original / (2 pi rotations)) / (2 ln theta).
double yarn_correction_dim(const YarnScaling& yarn, double rotations, int64_t head_dim,
                           double theta) {
  return static_cast<double>(head_dim) *
         std::log(static_cast<double>(yarn.original_max_positions) /
                  (rotations * 2 * std::numbers::pi)) /
         (2 * std::log(theta));
}

std::vector<float> yarn_inv_freq(int64_t head_dim, float theta, const YarnScaling& yarn) {
  const double low =
      std::max(std::floor(yarn_correction_dim(yarn, yarn.beta_fast, head_dim, theta)), 0.0);
  double high = std::min(std::ceil(yarn_correction_dim(yarn, yarn.beta_slow, head_dim, theta)),
                         static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;  // as transformers does, against a zero-width ramp
  const float factor = static_cast<float>(yarn.factor);
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float scale = cpu::rope_wavelength_scale(static_cast<int64_t>(i), head_dim, theta);
    const float extrapolation = 1.0f / scale, interpolation = 1.0f / (factor * scale);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float keep = 1.0f - ramp;  // the share of the unscaled frequency
    inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return inv_freq;
}

float yarn_attention_factor(const YarnScaling& yarn) {
  if (yarn.mscale != 0 && yarn.mscale_all_dim != 0)
    return static_cast<float>(yarn_mscale(yarn.factor, yarn.mscale) /
                              yarn_mscale(yarn.factor, yarn.mscale_all_dim));
  return static_cast<float>(yarn_mscale(yarn.factor, 1.0));
}

}  // namespace

Tensor yarn_rope_table(int64_t seq, int64_t head_dim, float theta, const YarnScaling& yarn) {
  SY_CHECK_MSG(seq >= 0 && head_dim > 0 && head_dim % 2 == 0,
               "yarn_rope_table: head_dim must be positive and even");
  Tensor table = Tensor::empty({seq, head_dim / 2, 2});
  cpu::rope_table<float>(seq, yarn_inv_freq(head_dim, theta, yarn), yarn_attention_factor(yarn),
                         table.data<float>());
  return table;
}

// On CUDA the table must be on the device too (a copy of rope_table's host tensor).
void rope_forward(Device& dev, const Tensor& table, Tensor& x) {
  check_rope_operands("rope_forward: x must be f32 or bf16 (batch, seq, heads, head_dim)", table,
                      x);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda_rope_rotate(table, x, false, op_stream(dev, "rope_forward", {&table, &x}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rope_forward: this build has no CUDA backend");
  if (any_bf16({&x})) {
    Tensor values = widened(x);
    rope_forward(dev, table, values);
    store(dev, values, x);
    return;
  }
  cpu::rope_forward<float>(table.data<float>(), x.data<float>(), x.dim(0), x.dim(1), x.dim(2),
                           x.dim(3));
}

void rope_backward(Device& dev, const Tensor& table, Tensor& dx) {
  check_rope_operands("rope_backward: dx must be f32 or bf16 (batch, seq, heads, head_dim)", table,
                      dx);
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cuda_rope_rotate(table, dx, true, op_stream(dev, "rope_backward", {&table, &dx}));
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "rope_backward: this build has no CUDA backend");
  if (any_bf16({&dx})) {
    Tensor values = widened(dx);
    rope_backward(dev, table, values);
    store(dev, values, dx);
    return;
  }
  cpu::rope_backward<float>(table.data<float>(), dx.data<float>(), dx.dim(0), dx.dim(1), dx.dim(2),
                            dx.dim(3));
}

}  // namespace switchyard
