// Where a training run's records go: the terminal's progress line, metrics.jsonl and
// TensorBoard are sinks behind one interface, each fed the same record of a logged step,
// an evaluation, a skipped step or the first step's memory peaks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/train/trainer.h"
#include "moe/router_stats.h"

namespace switchyard {

// A logged training step.
struct StepRecord {
  StepMetrics metrics;
  double peak_gflops = 0;  // the MFU's reference, all ranks together
  std::string peak_source;
  // Every MoE layer's routing in the step's last micro-batch, in global layer order.
  const RouterStats* router_stats = nullptr;
};

// An evaluation of the validation set.
struct EvalRecord {
  int64_t step = 0;
  double val_loss = 0;
  // A blend's loss per source, in blend order (empty for a recipe without data.sources).
  std::vector<std::pair<std::string, double>> by_source;
  // The routing of the evaluation's last batch.
  const RouterStats* router_stats = nullptr;
};

// A step whose loss or gradients were not finite, skipped by train.skip_non_finite_steps.
struct SkippedStepRecord {
  int64_t step = 0;
  std::string reason;
  int64_t skipped_steps = 0;  // since this start
};

// The first step's peak bytes on this rank by kind.
struct MemoryRecord {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t expert_parameters = 0, expert_gradients = 0, expert_optimizer_state = 0;
  int64_t activations = 0;
  // The reporting rank's pipeline stage, of how many: the stages hold different layers.
  int pipeline_stage = 0, pipeline_stages = 1;
};

class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual absl::Status on_step(const StepRecord& record) = 0;
  virtual absl::Status on_eval(const EvalRecord& record) = 0;
  virtual absl::Status on_skipped_step(const SkippedStepRecord& /*record*/) {
    return absl::OkStatus();
  }
  virtual absl::Status on_memory(const MemoryRecord& /*record*/) { return absl::OkStatus(); }
  // After the last record of a finished run: whether every write reached the file.
  virtual absl::Status close() { return absl::OkStatus(); }
};

// The sinks of a run, each record sent to every one in order; the first error is returned.
class RecordSinks {
 public:
  void add(std::unique_ptr<RecordSink> sink) { sinks_.push_back(std::move(sink)); }
  absl::Status on_step(const StepRecord& record);
  absl::Status on_eval(const EvalRecord& record);
  absl::Status on_skipped_step(const SkippedStepRecord& record);
  absl::Status on_memory(const MemoryRecord& record);
  absl::Status close();

 private:
  std::vector<std::unique_ptr<RecordSink>> sinks_;
};

// The reporting rank's sinks: the terminal (through `terminal`), run_dir/metrics.jsonl
// (created with run_dir; a run resuming from step `resume_step`, -1 for a fresh start,
// keeps the lines up to it) and a new TensorBoard event file in run_dir.
absl::StatusOr<RecordSinks> open_record_sinks(ProgressSink& terminal, const std::string& run_dir,
                                              int64_t resume_step);

}  // namespace switchyard
