#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

namespace switchyard {
namespace {

using testing::host_tensor;
using testing::max_relative_error;
using testing::random_vector;
using testing::values_of;

struct State {
  std::vector<double> param, exp_avg, exp_avg_sq;
};

// torch.optim.AdamW written out: decoupled decay first, then the bias-corrected step.
void reference_step(State& s, const std::vector<double>& grad, const AdamWHyper& h,
                    double grad_scale) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  for (size_t i = 0; i < s.param.size(); ++i) {
    const double g = grad[i] * grad_scale;
    s.exp_avg[i] = b1 * s.exp_avg[i] + (1 - b1) * g;
    s.exp_avg_sq[i] = b2 * s.exp_avg_sq[i] + (1 - b2) * g * g;
    const double m_hat = s.exp_avg[i] / (1 - std::pow(b1, h.step));
    const double v_hat = s.exp_avg_sq[i] / (1 - std::pow(b2, h.step));
    s.param[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * s.param[i]);
  }
}

TEST(AdamWTest, MatchesReferenceOverSeveralSteps) {
  const int64_t n = 40000;  // large enough for the parallel path
  const float grad_scale = 0.6f;
  AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
  const auto param0 = random_vector<float>(n, 81);
  Tensor param = host_tensor<float>(param0);
  Tensor exp_avg = Tensor::zeros({n});
  Tensor exp_avg_sq = Tensor::zeros({n});
  State ref{std::vector<double>(param0.begin(), param0.end()), std::vector<double>(n, 0.0),
            std::vector<double>(n, 0.0)};
  State tmpl = ref;
  for (int step = 1; step <= 6; ++step) {
    h.step = step;
    const auto grad = random_vector<float>(n, 100 + step, -2.0, 2.0);
    const std::vector<double> grad_d(grad.begin(), grad.end());
    adamw_step(cpu_device(), h, grad_scale, param, host_tensor<float>(grad), exp_avg, exp_avg_sq);
    reference_step(ref, grad_d, h, grad_scale);
    cpu::adamw_step(tmpl.param.data(), grad_d.data(), tmpl.exp_avg.data(), tmpl.exp_avg_sq.data(),
                    n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, grad_scale);
  }
  EXPECT_LT(max_relative_error(values_of<float>(param), ref.param), 1e-6);
  EXPECT_LT(max_relative_error(values_of<float>(exp_avg), ref.exp_avg), 1e-6);
  EXPECT_LT(max_relative_error(values_of<float>(exp_avg_sq), ref.exp_avg_sq), 1e-6);
  // The double template is the same formula, reordered only as PyTorch does.
  EXPECT_LT(max_relative_error(tmpl.param, ref.param), 1e-13);
  EXPECT_LT(max_relative_error(tmpl.exp_avg, ref.exp_avg), 1e-13);
  EXPECT_LT(max_relative_error(tmpl.exp_avg_sq, ref.exp_avg_sq), 1e-13);
}

TEST(AdamWTest, FirstStepMovesByLearningRateTimesSign) {
  // At step 1 the bias-corrected m / sqrt(v) is sign(g), so without decay each
  // parameter moves by about lr against its gradient.
  AdamWHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1};
  const std::vector<float> param0 = {0.5f, -0.25f, 1.0f};
  const std::vector<float> grad = {3.0f, -0.01f, 1e-3f};
  Tensor param = host_tensor<float>(param0);
  Tensor exp_avg = Tensor::zeros({3});
  Tensor exp_avg_sq = Tensor::zeros({3});
  adamw_step(cpu_device(), h, 1.0f, param, host_tensor<float>(grad), exp_avg, exp_avg_sq);
  const auto got = values_of<float>(param);
  EXPECT_NEAR(got[0], 0.5f - 1e-3f, 1e-7);
  EXPECT_NEAR(got[1], -0.25f + 1e-3f, 1e-7);
  EXPECT_NEAR(got[2], 1.0f - 1e-3f, 1e-6);
}

// The multi-tensor step gives each tensor the single-tensor step's values (weight decay
// only where asked), and writes the bf16 working copy of the new values.
TEST(AdamWTest, MultiTensorStepMatchesSingleSteps) {
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 2};
  const AdamWHyper no_decay{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 2};
  struct State {
    Tensor param, grad, exp_avg, exp_avg_sq;
  };
  auto state = [](int64_t n, uint64_t seed) {
    return State{host_tensor<float>(random_vector<float>(n, seed)),
                 host_tensor<float>(random_vector<float>(n, seed + 1, -2.0, 2.0)),
                 host_tensor<float>(random_vector<float>(n, seed + 2, -0.1, 0.1)),
                 host_tensor<float>(random_vector<float>(n, seed + 3, 0.01, 0.2))};
  };
  std::vector<State> multi = {state(70000, 1), state(3, 10), state(0, 20)};
  std::vector<State> single = {state(70000, 1), state(3, 10), state(0, 20)};
  Tensor work = Tensor::empty({70000}, DType::kBF16);
  adamw_step(
      cpu_device(), h, 0.5f,
      {AdamWUpdate{&multi[0].param, &multi[0].grad, &multi[0].exp_avg, &multi[0].exp_avg_sq, true,
                   &work},
       AdamWUpdate{&multi[1].param, &multi[1].grad, &multi[1].exp_avg, &multi[1].exp_avg_sq, false},
       AdamWUpdate{&multi[2].param, &multi[2].grad, &multi[2].exp_avg, &multi[2].exp_avg_sq,
                   true}});
  adamw_step(cpu_device(), h, 0.5f, single[0].param, single[0].grad, single[0].exp_avg,
             single[0].exp_avg_sq);
  adamw_step(cpu_device(), no_decay, 0.5f, single[1].param, single[1].grad, single[1].exp_avg,
             single[1].exp_avg_sq);
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_EQ(values_of<float>(multi[t].param), values_of<float>(single[t].param)) << t;
    EXPECT_EQ(values_of<float>(multi[t].exp_avg), values_of<float>(single[t].exp_avg)) << t;
    EXPECT_EQ(values_of<float>(multi[t].exp_avg_sq), values_of<float>(single[t].exp_avg_sq)) << t;
  }
  for (int64_t i = 0; i < 70000; ++i)
    ASSERT_EQ(work.data<bf16>()[i].bits, to_bf16(multi[0].param.data<float>()[i]).bits) << i;
}

}  // namespace
}  // namespace switchyard
