#include "moe/expert_bias.h"

#include <numeric>

#include "core/runtime/check.h"

namespace switchyard {

ExpertBiasBalancer::ExpertBiasBalancer(float rate, int num_experts)
    : rate_(rate), num_experts_(num_experts) {}

void ExpertBiasBalancer::add(const RouterStats& stats) {
  const size_t size = stats.layers.size() * num_experts_;
  if (loads_.empty()) loads_.assign(size, 0.0);
  SY_CHECK_MSG(loads_.size() == size && (size == 0 || stats.num_experts == num_experts_),
               "ExpertBiasBalancer: every forward of a step must route the same MoE layers");
  for (size_t l = 0; l < stats.layers.size(); ++l)
    for (int e = 0; e < num_experts_; ++e)
      loads_[l * num_experts_ + e] += stats.layers[l].selections_per_expert[e];
}

std::vector<std::vector<float>> ExpertBiasBalancer::take_updates(Communicator& data_parallel) {
  data_parallel.all_reduce_sum(loads_.data(), static_cast<int64_t>(loads_.size()));
  std::vector<std::vector<float>> updates;
  for (size_t first = 0; first < loads_.size(); first += num_experts_) {
    const std::vector<double> layer(loads_.begin() + first,
                                    loads_.begin() + first + num_experts_);
    updates.push_back(bias_update(layer, rate_));
  }
  loads_.clear();
  return updates;
}

std::vector<float> bias_update(const std::vector<double>& loads, float rate) {
  const double mean =
      std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(loads.size());
  std::vector<float> update(loads.size());
  for (size_t e = 0; e < loads.size(); ++e)
    update[e] = loads[e] < mean ? rate : loads[e] > mean ? -rate : 0.0f;
  return update;
}

void add_bias_update(Tensor& rows, int64_t first_row, const std::vector<float>& update) {
  SY_CHECK_MSG(rows.dtype() == DType::kF32 && first_row >= 0 &&
                   first_row + rows.numel() <= static_cast<int64_t>(update.size()),
               "add_bias_update: the rows lie outside the bias");
  // The rows themselves on the host, a copy of them on a device.
  Tensor host = rows.on_host();
  float* values = host.data<float>();
  for (int64_t i = 0; i < rows.numel(); ++i) values[i] += update[first_row + i];
  if (host.raw_data() != rows.raw_data()) rows.copy_from(host);
}

}  // namespace switchyard
