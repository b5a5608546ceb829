#include "kernels/elementwise.h"

#include "kernels/convert.h"
#include "kernels/cpu/elementwise.h"
#ifdef SWITCHYARD_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/elementwise.h"
#endif

namespace switchyard {
namespace {}  // namespace

void add_(Device& dev, Tensor& y, const Tensor& x, float alpha) {
  SY_CHECK_MSG(is_float(y) && x.dtype() == y.dtype(),
               "add_: y and x must be both f32 or both bf16");
  SY_CHECK_MSG(x.numel() == y.numel(), "add_: x and y must have the same number of elements");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "add_", {&y, &x});
    with_cuda_type(y, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::add(cuda_data<T>(y), cuda_data<T>(x), alpha, y.numel(), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "add_: this build has no CUDA backend");
  if (any_bf16({&y})) {
    Tensor result = widened(y);
    add_(dev, result, widened(x), alpha);
    store(dev, result, y);
    return;
  }
  cpu::add(y.data<float>(), x.data<float>(), alpha, y.numel());
}

void scale_(Device& dev, Tensor& x, float alpha) {
  SY_CHECK_MSG(is_float(x), "scale_: x must be f32 or bf16");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "scale_", {&x});
    with_cuda_type(x, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::scale(cuda_data<T>(x), alpha, x.numel(), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "scale_: this build has no CUDA backend");
  if (any_bf16({&x})) {
    Tensor result = widened(x);
    scale_(dev, result, alpha);
    store(dev, result, x);
    return;
  }
  cpu::scale(x.data<float>(), alpha, x.numel());
}

void add_bias_(Device& dev, Tensor& y, const Tensor& bias) {
  SY_CHECK_MSG(is_float(y) && is_float(bias), "add_bias_: y and bias must each be f32 or bf16");
  SY_CHECK_MSG(y.rank() == 2, "add_bias_: y must be (rows, n)");
  SY_CHECK_MSG(bias.shape() == Shape({y.dim(1)}), "add_bias_: bias must be (n)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "add_bias_", {&y, &bias});
    with_cuda_types(y, bias, [&](auto y_type, auto bias_type) {
      using T = typename decltype(y_type)::type;
      using B = typename decltype(bias_type)::type;
      cuda::add_bias(cuda_data<T>(y), cuda_data<B>(bias), y.dim(0), y.dim(1), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "add_bias_: this build has no CUDA backend");
  if (any_bf16({&y, &bias})) {
    Tensor result = widened(y);
    add_bias_(dev, result, widened(bias));
    store(dev, result, y);
    return;
  }
  cpu::add_bias(y.data<float>(), bias.data<float>(), y.dim(0), y.dim(1));
}

void bias_backward(Device& dev, const Tensor& dy, Tensor& dbias) {
  SY_CHECK_MSG(is_float(dy) && dbias.dtype() == DType::kF32,
               "bias_backward: dy must be f32 or bf16, dbias f32");
  SY_CHECK_MSG(dy.rank() == 2, "bias_backward: dy must be (rows, n)");
  SY_CHECK_MSG(dbias.shape() == Shape({dy.dim(1)}), "bias_backward: dbias must be (n)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "bias_backward", {&dy, &dbias});
    with_cuda_type(dy, [&](auto type) {
      using T = typename decltype(type)::type;
      cuda::bias_backward(cuda_data<T>(dy), dbias.data<float>(), dy.dim(0), dy.dim(1), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "bias_backward: this build has no CUDA backend");
  if (any_bf16({&dy})) {
    bias_backward(dev, widened(dy), dbias);
    return;
  }
  cpu::bias_backward(dy.data<float>(), dbias.data<float>(), dy.dim(0), dy.dim(1));
}

std::vector<double> sum_squares(Device& dev, const std::vector<Tensor>& xs) {
  std::vector<double> totals(xs.size(), 0.0);
  if (xs.empty()) return totals;
  for (const Tensor& x : xs)
    SY_CHECK_MSG(is_float(x) && x.dtype() == xs[0].dtype(),
                 "sum_squares: tensors must be all f32 or all bf16");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = nullptr;
    std::vector<int64_t> sizes;
    for (const Tensor& x : xs) {
      stream = op_stream(dev, "sum_squares", {&x});
      sizes.push_back(x.numel());
    }
    // The double totals live in 8-byte cells on the device, read back in one copy.
    static_assert(sizeof(int64_t) == sizeof(double));
    const int64_t count = static_cast<int64_t>(xs.size());
    Tensor cells = Tensor::empty({count}, DType::kI64, MemoryKind::kOther, dev);
    with_cuda_type(xs[0], [&](auto type) {
      using T = typename decltype(type)::type;
      std::vector<const T*> data;
      for (const Tensor& x : xs) data.push_back(cuda_data<T>(x));
      cuda::sum_squares(data.data(), sizes.data(), static_cast<int>(count),
                        static_cast<double*>(cells.raw_data()), stream);
    });
    dev.copy_to_host(totals.data(), cells.raw_data(), cells.nbytes());
    return totals;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sum_squares: this build has no CUDA backend");
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor x = any_bf16({&xs[i]}) ? widened(xs[i]) : xs[i];
    totals[i] = cpu::sum_squares(x.data<float>(), x.numel());
  }
  return totals;
}

double sum_squares(Device& dev, const Tensor& x) {
  return sum_squares(dev, std::vector<Tensor>{x})[0];
}

std::vector<ExactSum> row_sum_squares(Device& dev, const std::vector<Tensor>& xs) {
  std::vector<ExactSum> sums(xs.size());
  for (const Tensor& x : xs)
    SY_CHECK_MSG(is_float(x), "row_sum_squares: tensors must be f32 or bf16");
  auto rows_of = [](const Tensor& x) { return x.rank() > 0 ? x.dim(0) : int64_t{1}; };
  auto row_length = [&](const Tensor& x) { return rows_of(x) > 0 ? x.numel() / rows_of(x) : 0; };
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    // One launch per tensor into one buffer of row sums, read back with a single wait.
    std::vector<int64_t> first_row(xs.size() + 1, 0);
    for (size_t i = 0; i < xs.size(); ++i) first_row[i + 1] = first_row[i] + rows_of(xs[i]);
    Tensor cells = Tensor::empty({first_row.back()}, DType::kI64, MemoryKind::kOther, dev);
    double* cell_sums = static_cast<double*>(cells.raw_data());
    for (size_t i = 0; i < xs.size(); ++i) {
      cudaStream_t stream = op_stream(dev, "row_sum_squares", {&xs[i]});
      with_cuda_type(xs[i], [&](auto type) {
        using T = typename decltype(type)::type;
        cuda::row_sum_squares(cuda_data<T>(xs[i]), rows_of(xs[i]), row_length(xs[i]),
                              cell_sums + first_row[i], stream);
      });
    }
    std::vector<double> row_sums(first_row.back());
    dev.copy_to_host(row_sums.data(), cells.raw_data(), cells.nbytes());
    for (size_t i = 0; i < xs.size(); ++i)
      for (int64_t r = first_row[i]; r < first_row[i + 1]; ++r) sums[i].add(row_sums[r]);
    return sums;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "row_sum_squares: this build has no CUDA backend");
  // Each row's sum as sum_squares computes it, read in place.
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor x = any_bf16({&xs[i]}) ? widened(xs[i]) : xs[i];
    const int64_t rows = rows_of(x), row = row_length(x);
    for (int64_t r = 0; r < rows; ++r)
      sums[i].add(cpu::sum_squares(x.data<float>() + r * row, row));
  }
  return sums;
}

void sigmoid_gate_forward(Device& dev, const Tensor& x, const Tensor& g, Tensor& y) {
  SY_CHECK_MSG(is_float(x) && y.dtype() == x.dtype() && is_float(g),
               "sigmoid_gate_forward: x and y must be both f32 or both bf16, g f32 or bf16");
  SY_CHECK_MSG(x.rank() == 2, "sigmoid_gate_forward: x must be (rows, n)");
  SY_CHECK_MSG(y.shape() == x.shape(), "sigmoid_gate_forward: y must have the shape of x");
  SY_CHECK_MSG(g.shape() == Shape({x.dim(0), 1}), "sigmoid_gate_forward: g must be (rows, 1)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "sigmoid_gate_forward", {&x, &g, &y});
    with_cuda_types(x, g, [&](auto x_type, auto g_type) {
      using T = typename decltype(x_type)::type;
      using G = typename decltype(g_type)::type;
      cuda::sigmoid_gate_forward(cuda_data<T>(x), cuda_data<G>(g), cuda_data<T>(y), x.dim(0),
                                 x.dim(1), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sigmoid_gate_forward: this build has no CUDA backend");
  if (any_bf16({&x, &g})) {
    Tensor result = widened(y);
    sigmoid_gate_forward(dev, widened(x), widened(g), result);
    store(dev, result, y);
    return;
  }
  cpu::sigmoid_gate_forward(x.data<float>(), g.data<float>(), y.data<float>(), x.dim(0), x.dim(1));
}

void sigmoid_gate_backward(Device& dev, const Tensor& dy, const Tensor& x, const Tensor& g,
                           Tensor& dx, Tensor& dg) {
  SY_CHECK_MSG(is_float(x) && dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && is_float(g) &&
                   dg.dtype() == g.dtype(),
               "sigmoid_gate_backward: dy, x and dx must be all f32 or all bf16, g and dg both "
               "f32 or both bf16");
  SY_CHECK_MSG(x.rank() == 2, "sigmoid_gate_backward: x must be (rows, n)");
  SY_CHECK_MSG(dy.shape() == x.shape(), "sigmoid_gate_backward: dy must have the shape of x");
  SY_CHECK_MSG(dx.shape() == x.shape(), "sigmoid_gate_backward: dx must have the shape of x");
  SY_CHECK_MSG(g.shape() == Shape({x.dim(0), 1}), "sigmoid_gate_backward: g must be (rows, 1)");
  SY_CHECK_MSG(dg.shape() == g.shape(), "sigmoid_gate_backward: dg must be (rows, 1)");
#ifdef SWITCHYARD_WITH_CUDA
  if (dev.is_cuda()) {
    cudaStream_t stream = op_stream(dev, "sigmoid_gate_backward", {&dy, &x, &g, &dx, &dg});
    with_cuda_types(x, g, [&](auto x_type, auto g_type) {
      using T = typename decltype(x_type)::type;
      using G = typename decltype(g_type)::type;
      cuda::sigmoid_gate_backward(cuda_data<T>(dy), cuda_data<T>(x), cuda_data<G>(g),
                                  cuda_data<T>(dx), cuda_data<G>(dg), x.dim(0), x.dim(1), stream);
    });
    return;
  }
#endif
  SY_CHECK_MSG(!dev.is_cuda(), "sigmoid_gate_backward: this build has no CUDA backend");
  if (any_bf16({&x, &g})) {
    Tensor dx_values = f32_result(dx), dg_values = f32_result(dg);
    sigmoid_gate_backward(dev, widened(dy), widened(x), widened(g), dx_values, dg_values);
    store(dev, dx_values, dx);
    store(dev, dg_values, dg);
    return;
  }
  cpu::sigmoid_gate_backward(dy.data<float>(), x.data<float>(), g.data<float>(), dx.data<float>(),
                             dg.data<float>(), x.dim(0), x.dim(1));
}

}  // namespace switchyard
