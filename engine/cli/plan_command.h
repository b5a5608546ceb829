// `switchyard plan RECIPE --world N --device-memory BYTES
//                 [--layout pp=P,tp=T,ep=E,zero=Z[,recompute=none|selective|full] | recipe]
//                 [--gpu NAME | --peak-tflops T] [--bandwidth GB/s] [--set ...] [--json F]
//                 [--overwrite]`:
// the memory every rank of a layout needs (the trainer's own accounting,
// engine/train/memory_plan.h, pipeline stages included), its FLOPs and an estimated step
// time (with the pipeline's bubble), for one layout or every valid layout of N ranks
// (pipeline, tensor and expert parallel sizes, ZeRO stages), each with the least activation
// recomputation that fits
// (unless named); the layouts that fit with a tenth of the device to spare ranked by step
// time, then those that fit more tightly, and for each that does not, the term that
// exceeds the device (docs/planning.md).
// Wiring in main(): construct PlanCommand on the app before parsing, then
//   if (plan_command.parsed()) return report(plan_command.run());
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/recipe.h"
#include "engine/train/peak.h"

namespace switchyard {

class PlanCommand {
 public:
  explicit PlanCommand(CLI::App& app);

  bool parsed() const;
  // Prints the ranked layouts to stdout (and writes --json); errors come back.
  absl::Status run();

 private:
  absl::StatusOr<Peak> device_peak(const config::Recipe& recipe, bool recipe_on_cpu) const;

  CLI::App* plan_ = nullptr;
  std::string recipe_path_;
  std::vector<std::string> overrides_;
  int world_ = 0;
  std::string device_memory_;
  std::string layout_;
  std::string gpu_ = "H100";
  double peak_tflops_ = 0;
  double bandwidth_gbps_ = 50;
  std::string json_path_;
  bool overwrite_ = false;
};

}  // namespace switchyard
