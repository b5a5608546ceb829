// The training loop: micro-batches with gradient accumulation, AdamW or Muon, evaluation,
// metrics.jsonl, progress through a sink, final weights.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/recipe.pb.h"
#include "core/runtime/op_clock.h"
#include "engine/parallel/topology.h"
#include "engine/train/peak.h"

namespace switchyard {

struct StepMetrics {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;           // total loss (cross-entropy + weighted aux and z losses)
  double cross_entropy = 0;
  double aux_loss = 0;
  double z_loss = 0;
  // The sequence-wise aux loss, with moe.seq_aux_loss_coef > 0.
  std::optional<double> seq_aux_loss;
  // The MTP modules' mean cross-entropy, with model.mtp_depth > 0 (LossParts::mtp_loss).
  std::optional<double> mtp_loss;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double mfu = 0;            // model FLOPs utilisation against the stated peak
  double dropped_fraction = 0;  // dropped expert assignments / assignments
  double worst_load_ratio = 0;  // max over MoE layers of max/mean tokens per expert
  // The digest of every MoE layer's selections per expert and the dropped assignments
  // since the last report, over every rank (engine/train/routing_tally.h).
  std::string routing_digest;
  // Share of rank 0's wall time since the last report spent in expert-parallel
  // all-to-all exchanges (waiting for slower ranks included).
  double all_to_all_share = 0;
  double elapsed_s = 0;
  double eta_s = 0;
  // A blend's training tokens drawn from each source so far, in blend order (empty for a
  // recipe without data.sources).
  std::vector<std::pair<std::string, int64_t>> tokens_by_source;
  // train --op-times: this rank's seconds per step by kind of work since the last report.
  std::optional<OpTimes> op_times;
};

// Where the trainer reports; the CLI prints, tests collect.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual void on_step(const StepMetrics& m) = 0;
  virtual void on_eval(int64_t step, double val_loss) = 0;
  // A blend's validation loss per source, after its on_eval (sinks that show only the
  // blend's figure need not override it).
  virtual void on_source_evals(int64_t /*step*/,
                               const std::vector<std::pair<std::string, double>>& /*losses*/) {}
  virtual void on_message(const std::string& text) = 0;
};

struct TrainOptions {
  std::string run_dir;
  // The MFU's reference: --peak-gflops, or where to cache the CPU's calibration
  // (engine/train/peak.h).
  PeakOptions peak;
  // Where a data.corpus is prepared into a dataset on first use; empty means the
  // default cache (data/corpus_cache.h).
  std::string dataset_cache_dir;
  // The job's process groups (from make_process_groups); null trains in one process.
  // Only world rank 0 reports through the sink and writes into run_dir.
  ProcessGroups* groups = nullptr;
  // CPU threads when the recipe leaves runtime.threads at 0 (0: every core).
  int threads_per_rank = 0;
  // Set (by a signal handler) to stop at the next step boundary after a checkpoint.
  const std::atomic<bool>* stop_requested = nullptr;
  // This process's rank among the node's processes, which picks its GPU.
  int local_rank = 0;
  // A checkpoint directory to resume from instead of the one `latest` names.
  std::string resume_from;
  // Resuming, the recipe may change train.steps, optimizer.min_lr, optimizer.decay and
  // optimizer.router_lr_scale: the decay restarts from the checkpoint's rate
  // (docs/training.md, "Checkpoints and resuming").
  bool extend_schedule = false;
  // Times each step's kinds of work (core/runtime/op_clock.h): each logged step records
  // them and the run ends with a table of them.
  bool op_times = false;
};

// How a run that did not fail ended.
enum class TrainEnd {
  kFinished,  // trained train.steps and saved the final weights
  kStopped,   // stopped on request (options.stop_requested) after saving a checkpoint
};

// The parallel layout as the trainer's start line and `train --dry-run` name it:
// "dp 2, tp 1, ep 2, pp 4, V 2, zero 1" (V only with more than one chunk per stage).
std::string describe_layout(const Layout& layout, int zero_stage);

// Trains `recipe` (already validated, paths resolved) and writes into options.run_dir:
// metrics.jsonl, checkpoints under <checkpoint.dir> (every checkpoint.interval_steps,
// at the end, and when stopped), and the final weights (with the tokenizer) under
// <checkpoint.dir>/final. When run_dir already holds a checkpoint, training resumes
// from the one `latest` names (or options.resume_from) and continues exactly as if it
// had never stopped; a checkpoint that cannot be read is refused, naming the newest
// complete one, never taken for a fresh start.
absl::StatusOr<TrainEnd> train(const config::Recipe& recipe, const TrainOptions& options,
                               ProgressSink& sink);

}  // namespace switchyard
