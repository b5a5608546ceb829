#include "engine/train/record_sinks.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/runtime/file_util.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "engine/train/metrics_log.h"
#include "engine/train/tensorboard_writer.h"
#include "moe/balance_stats.h"

namespace switchyard {

namespace fs = std::filesystem;

namespace {

// A step's metrics.jsonl object; TensorBoard's train/ scalars are its numbers.
nlohmann::ordered_json step_json(const StepRecord& record) {
  const StepMetrics& m = record.metrics;
  nlohmann::ordered_json j = {
      {"step", m.step},       {"loss", m.loss},         {"cross_entropy", m.cross_entropy},
      {"aux_loss", m.aux_loss}, {"z_loss", m.z_loss},   {"lr", m.lr},
      {"grad_norm", m.grad_norm}, {"tokens_per_s", m.tokens_per_s}, {"mfu", m.mfu},
      {"dropped_fraction", m.dropped_fraction}, {"worst_load_ratio", m.worst_load_ratio},
      {"all_to_all_share", m.all_to_all_share}, {"routing_digest", m.routing_digest},
      {"elapsed_s", m.elapsed_s},
      {"peak_gflops", record.peak_gflops}, {"peak_source", record.peak_source}};
  if (m.seq_aux_loss) j["seq_aux_loss"] = *m.seq_aux_loss;
  if (m.mtp_loss) j["mtp_loss"] = *m.mtp_loss;
  for (const auto& [name, tokens] : m.tokens_by_source) j["tokens_by_source"][name] = tokens;
  if (m.op_times) {
    for (int k = 0; k < kNumOpKinds; ++k) {
      const OpKind kind = static_cast<OpKind>(k);
      j["op_times"][std::string(op_kind_name(kind))] = {
          {"forward_s", m.op_times->at(kind, OpPass::kForward)},
          {"backward_s", m.op_times->at(kind, OpPass::kBackward)}};
    }
  }
  // Each MoE layer's max/mean tokens per expert in this step's last micro-batch (read
  // back by `bench balance --run-dir`).
  std::vector<double> layer_imbalance;
  for (const RouterStats::Layer& layer : record.router_stats->layers)
    layer_imbalance.push_back(layer_load(layer).imbalance);
  if (!layer_imbalance.empty()) j["layer_imbalance"] = layer_imbalance;
  return j;
}

std::string mebibytes(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// The progress line and messages, through the trainer's ProgressSink.
class TerminalSink : public RecordSink {
 public:
  explicit TerminalSink(ProgressSink& terminal) : terminal_(terminal) {}
  absl::Status on_step(const StepRecord& record) override {
    terminal_.on_step(record.metrics);
    return absl::OkStatus();
  }
  absl::Status on_eval(const EvalRecord& record) override {
    terminal_.on_eval(record.step, record.val_loss);
    if (!record.by_source.empty()) terminal_.on_source_evals(record.step, record.by_source);
    return absl::OkStatus();
  }
  absl::Status on_skipped_step(const SkippedStepRecord& r) override {
    terminal_.on_message(absl::StrCat("skipped step ", r.step, ": ", r.reason, " (",
                                      r.skipped_steps, " skipped)"));
    return absl::OkStatus();
  }
  absl::Status on_memory(const MemoryRecord& r) override {
    auto both = [](int64_t dense, int64_t expert) {
      return absl::StrCat(mebibytes(dense + expert), " (experts ", mebibytes(expert), ")");
    };
    const std::string whose =
        r.pipeline_stages > 1
            ? absl::StrCat("memory of pipeline stage ", r.pipeline_stage, " of ",
                           r.pipeline_stages, " (rank 0; each stage holds its own layers)")
            : "memory per rank";
    terminal_.on_message(absl::StrCat(
        whose, ": parameters ", both(r.parameters, r.expert_parameters),
        ", gradients ", both(r.gradients, r.expert_gradients), ", optimizer state ",
        both(r.optimizer_state, r.expert_optimizer_state), ", peak activations ",
        mebibytes(r.activations)));
    return absl::OkStatus();
  }

 private:
  ProgressSink& terminal_;
};

// One JSON object per line of metrics.jsonl.
class MetricsJsonlSink : public RecordSink {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsJsonlSink>> open(const std::string& run_dir,
                                                                int64_t resume_step) {
    const std::string path = run_dir + "/metrics.jsonl";
    SY_RETURN_IF_ERROR(refuse_symlink(path, run_dir));
    // A resumed run keeps the lines up to its checkpoint (rewritten atomically) and
    // continues after them; a fresh run replaces only a file the engine wrote. Read and
    // appended without following a link planted at its name.
    std::string kept;
    std::error_code ec;
    if (fs::exists(fs::symlink_status(path, ec))) {
      SY_ASSIGN_OR_RETURN(const std::string text,
                          read_file(path, kMaxMetricsFileBytes, Links::kRefuse));
      if (resume_step < 0) SY_RETURN_IF_ERROR(check_written_by_engine(text, path));
      if (resume_step >= 0) {
        SY_ASSIGN_OR_RETURN(const std::vector<std::string> lines,
                            metrics_lines_up_to(text, resume_step, path));
        for (const std::string& line : lines) absl::StrAppend(&kept, line, "\n");
      }
    }
    SY_RETURN_IF_ERROR(write_file_atomically(path, kept));
    SY_ASSIGN_OR_RETURN(const int fd, open_to_append(path));
    return std::unique_ptr<MetricsJsonlSink>(new MetricsJsonlSink(path, fd));
  }
  ~MetricsJsonlSink() override { ::close(fd_); }
  absl::Status on_step(const StepRecord& record) override {
    return write(step_json(record));
  }
  absl::Status on_eval(const EvalRecord& record) override {
    nlohmann::ordered_json j = {{"step", record.step}, {"val_loss", record.val_loss}};
    for (const auto& [name, loss] : record.by_source) j["val_loss_by_source"][name] = loss;
    return write(j);
  }
  absl::Status on_skipped_step(const SkippedStepRecord& r) override {
    return write({{"step", r.step}, {"skipped", r.reason}, {"skipped_steps", r.skipped_steps}});
  }
  absl::Status on_memory(const MemoryRecord& r) override {
    return write({{"memory_bytes",
                   {{"parameters", r.parameters},
                    {"gradients", r.gradients},
                    {"optimizer_state", r.optimizer_state},
                    {"expert_parameters", r.expert_parameters},
                    {"expert_gradients", r.expert_gradients},
                    {"expert_optimizer_state", r.expert_optimizer_state},
                    {"activations", r.activations}}}});
  }
  absl::Status close() override { return failed_; }

 private:
  MetricsJsonlSink(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  // A failed write shows at close(); the lines after it are not written.
  absl::Status write(const nlohmann::ordered_json& j) {
    if (failed_.ok()) failed_ = write_all(fd_, j.dump() + "\n", path_);
    return absl::OkStatus();
  }

  std::string path_;
  int fd_;
  absl::Status failed_;
};

// TensorBoard events beside metrics.jsonl (a new file per run or resume, as TensorBoard
// expects).
class TensorBoardSink : public RecordSink {
 public:
  explicit TensorBoardSink(std::unique_ptr<TensorBoardWriter> writer)
      : writer_(std::move(writer)) {}
  absl::Status on_step(const StepRecord& record) override {
    const int64_t step = record.metrics.step;
    const nlohmann::ordered_json line = step_json(record);
    for (const auto& [key, value] : line.items())
      if (value.is_number() && key != "step" && key != "elapsed_s" && key != "peak_gflops")
        SY_RETURN_IF_ERROR(writer_->add_scalar("train/" + key, value.get<double>(), step));
    for (const auto& [name, tokens] : record.metrics.tokens_by_source)
      SY_RETURN_IF_ERROR(
          writer_->add_scalar("data/tokens/" + name, static_cast<double>(tokens), step));
    const RouterStats& rs = *record.router_stats;
    if (!rs.selections_per_expert.empty())
      SY_RETURN_IF_ERROR(
          writer_->add_histogram("moe/selections_per_expert", rs.selections_per_expert, step));
    // Each MoE layer's load in this step's last micro-batch: max/mean tokens per expert,
    // the share dropped by moe.capacity_factor, the coefficient of variation, the experts
    // given no token, and the tokens per expert.
    for (size_t l = 0; l < rs.layers.size(); ++l) {
      const RouterStats::Layer& layer = rs.layers[l];
      const LayerLoad load = layer_load(layer);
      const std::string prefix = absl::StrCat("moe/layer_", l, "/");
      SY_RETURN_IF_ERROR(writer_->add_scalar(prefix + "imbalance", load.imbalance, step));
      SY_RETURN_IF_ERROR(writer_->add_scalar(prefix + "dropped", load.dropped_fraction, step));
      SY_RETURN_IF_ERROR(writer_->add_scalar(prefix + "cv", load.cv, step));
      SY_RETURN_IF_ERROR(writer_->add_scalar(prefix + "dead_experts",
                                             static_cast<double>(load.dead_experts), step));
      SY_RETURN_IF_ERROR(
          writer_->add_histogram(prefix + "tokens_per_expert", layer.selections_per_expert, step));
    }
    return writer_->flush();
  }
  absl::Status on_eval(const EvalRecord& record) override {
    SY_RETURN_IF_ERROR(writer_->add_scalar("eval/val_loss", record.val_loss, record.step));
    for (const auto& [name, loss] : record.by_source)
      SY_RETURN_IF_ERROR(writer_->add_scalar("eval/val_loss/" + name, loss, record.step));
    // The layers x experts load of the last evaluation batch, as an image.
    std::vector<std::vector<double>> shares;
    for (const RouterStats::Layer& layer : record.router_stats->layers)
      shares.push_back(layer_load(layer).share);
    if (!shares.empty()) {
      constexpr int kHeatmapCellPixels = 24;
      const RgbImage heatmap = load_heatmap(shares, kHeatmapCellPixels);
      SY_RETURN_IF_ERROR(writer_->add_image("moe/load_heatmap", heatmap.height, heatmap.width,
                                            heatmap.rgb, record.step));
    }
    return writer_->flush();
  }

 private:
  std::unique_ptr<TensorBoardWriter> writer_;
};

}  // namespace

absl::Status RecordSinks::on_step(const StepRecord& record) {
  for (auto& sink : sinks_) SY_RETURN_IF_ERROR(sink->on_step(record));
  return absl::OkStatus();
}

absl::Status RecordSinks::on_eval(const EvalRecord& record) {
  for (auto& sink : sinks_) SY_RETURN_IF_ERROR(sink->on_eval(record));
  return absl::OkStatus();
}

absl::Status RecordSinks::on_skipped_step(const SkippedStepRecord& record) {
  for (auto& sink : sinks_) SY_RETURN_IF_ERROR(sink->on_skipped_step(record));
  return absl::OkStatus();
}

absl::Status RecordSinks::on_memory(const MemoryRecord& record) {
  for (auto& sink : sinks_) SY_RETURN_IF_ERROR(sink->on_memory(record));
  return absl::OkStatus();
}

absl::Status RecordSinks::close() {
  for (auto& sink : sinks_) SY_RETURN_IF_ERROR(sink->close());
  return absl::OkStatus();
}

absl::StatusOr<RecordSinks> open_record_sinks(ProgressSink& terminal, const std::string& run_dir,
                                              int64_t resume_step) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat(run_dir, ": cannot create the run directory: ", ec.message()));
  RecordSinks sinks;
  SY_ASSIGN_OR_RETURN(std::unique_ptr<MetricsJsonlSink> metrics,
                      MetricsJsonlSink::open(run_dir, resume_step));
  sinks.add(std::move(metrics));
  SY_ASSIGN_OR_RETURN(std::unique_ptr<TensorBoardWriter> writer,
                      TensorBoardWriter::create(run_dir));
  sinks.add(std::make_unique<TensorBoardSink>(std::move(writer)));
  // Last, so a line the terminal shows is already in the files.
  sinks.add(std::make_unique<TerminalSink>(terminal));
  return sinks;
}

}  // namespace switchyard
