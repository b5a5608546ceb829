// Central finite differences for the gradient checks, written once: the two evaluations at
// x + step and x - step, the restore, and the quotient.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "engine/runtime/param_store.h"
#include "engine/runtime/rng.h"

namespace switchyard::testing {

// d loss / d x by central differences; x holds its own value again afterwards.
template <typename Loss>
double central_difference(double& x, double step, Loss&& loss) {
  const double saved = x;
  x = saved + step;
  const double up = loss();
  x = saved - step;
  const double down = loss();
  x = saved;
  return (up - down) / (2 * step);
}

// The central difference of every `stride`-th element of x, in order.
template <typename Loss>
std::vector<double> central_differences(std::vector<double>& x, double step, Loss&& loss,
                                        size_t stride = 1) {
  std::vector<double> grad;
  for (size_t i = 0; i < x.size(); i += stride) {
    grad.push_back(central_difference(x[i], step, loss));
  }
  return grad;
}

// A model parameter's gradient along one direction of +-1 entries (drawn from the
// parameter's name): from its backward, and by central differences of loss() with the
// float weights moved by +-step along it.
struct DirectionalDerivative {
  double analytic = 0;
  double numeric = 0;
};

template <typename Loss>
DirectionalDerivative directional_derivative(Param& p, double step, Loss&& loss) {
  Rng dir(std::hash<std::string>{}(p.name));
  std::vector<float> d(p.value.numel());
  DirectionalDerivative out;
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = dir.uniform() < 0.5 ? -1.0f : 1.0f;
    out.analytic += static_cast<double>(d[i]) * p.grad.data<float>()[i];
  }
  float* w = p.value.data<float>();
  for (size_t i = 0; i < d.size(); ++i) w[i] += static_cast<float>(step) * d[i];
  const double plus = loss();
  for (size_t i = 0; i < d.size(); ++i) w[i] -= static_cast<float>(2 * step) * d[i];
  const double minus = loss();
  for (size_t i = 0; i < d.size(); ++i) w[i] += static_cast<float>(step) * d[i];
  out.numeric = (plus - minus) / (2 * step);
  return out;
}

}  // namespace switchyard::testing
