// The switchyard command line. Every user-caused error ends here as one line on stderr
// and exit status 1.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <csignal>

#include <cmath>
#include <cstdio>
#include <exception>
#include <numeric>
#include <new>
#include <filesystem>
#include <optional>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "checkpoint/weights.h"
#include "core/config/recipe.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "core/runtime/text.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "engine/cli/bench_command.h"
#include "engine/cli/build_info.h"
#include "engine/cli/convert_command.h"
#include "engine/cli/data_commands.h"
#include "engine/cli/load_model.h"
#include "engine/cli/number_flags.h"
#include "engine/cli/plan_command.h"
#include "engine/cli/progress_line.h"
#include "engine/cli/sample_command.h"
#include "engine/model/model_stats.h"
#include "engine/model/transformer.h"
#include "engine/parallel/mpi_runtime.h"
#include "engine/parallel/topology.h"
#include "engine/train/evaluation.h"
#include "engine/train/memory_plan.h"
#include "engine/train/trainer.h"
#include "kernels/devices.h"
#include "kernels/threads.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// The most ranks a dry run plans for, one line each.
constexpr int kMaxDryRunWorld = 4096;
// 10^12 GFLOP/s, a zettaflop: beyond any machine's peak, and far from overflow in the MFU.
constexpr double kMaxPeakGflops = 1e12;
// Windows of train.seq_len (at most 2^24 positions): 2^36 of them keep their tokens
// below 2^60, beyond any dataset (eval takes the dataset's windows when it has fewer).
constexpr int64_t kMaxEvalWindows = int64_t{1} << 36;

// SIGTERM or SIGINT asks training to checkpoint and stop at the next step boundary
// (preemption); a second one ends the process at once. Either way the exit status is
// 128 + the first signal's number, as a shell reports a process a signal ended
// (docs/training.md, "Faults").
std::atomic<bool> g_stop_requested{false};
std::atomic<int> g_stop_signal{0};

void on_stop_signal(int signal) {
  int first = 0;
  g_stop_signal.compare_exchange_strong(first, signal);
  if (g_stop_requested.exchange(true)) _exit(128 + g_stop_signal.load());
  static const char kMessage[] =
      "switchyard: stopping after this step's checkpoint (signal again to stop now)\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
}

// The ranks a dry run plans for: --world, else the launcher's, else the fewest that the
// recipe's tensor and expert parallel sizes divide.
int dry_run_world(const config::Recipe& recipe, int world_option) {
  if (world_option > 0) return world_option;
  if (MpiRuntime::get().launched()) return MpiRuntime::get().world_size();
  return std::lcm(std::max(recipe.parallel().tensor_parallel_size(), 1),
                  std::max(recipe.parallel().expert_parallel_size(), 1));
}

// Counts, FLOPs and the memory every rank of `layout` needs at least, without opening a
// device or allocating the model.
absl::Status dry_run(const config::Recipe& recipe, const Layout& layout) {
  const ModelStats s = compute_model_stats(recipe);
  const bool on_gpu = recipe.runtime().device() == "cuda" ||
                      (recipe.runtime().device().empty() && visible_gpus() > 0);
  const DType working = working_dtype(recipe.runtime().precision(), on_gpu);
  const std::vector<RankMemory> memory = plan_rank_memory(recipe, layout, working);
  nlohmann::ordered_json per_rank = nlohmann::ordered_json::array();
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const RankMemory& m : memory) {
    per_rank.push_back(m.total());
    ranks.push_back(rank_memory_json(m));
  }
  nlohmann::ordered_json j = {
      {"recipe", recipe.name()},
      {"total_params", s.total_params},
      {"active_params", s.active_params},
      {"expert_params", s.expert_params},
      {"embedding_params", s.embedding_params},
      {"forward_flops_per_token", s.forward_flops_per_token},
      {"train_flops_per_token", s.train_flops_per_token},
      {"world_size", layout.world_size},
      {"min_bytes_per_rank", per_rank},
      {"ranks", ranks}};
  std::printf("%s: %.3fB parameters, %.3fB active per token, %.3f GFLOPs/token forward, "
              "%.3f GFLOPs/token training (seq_len %lld)\n",
              recipe.name().c_str(), s.total_params / 1e9, s.active_params / 1e9,
              s.forward_flops_per_token / 1e9, s.train_flops_per_token / 1e9,
              static_cast<long long>(recipe.train().seq_len()));
  std::printf("memory per rank before the first step, %d rank%s (%s) on %s in %s:\n",
              layout.world_size, layout.world_size == 1 ? "" : "s",
              describe_layout(layout, recipe.parallel().zero_stage()).c_str(),
              on_gpu ? "GPUs" : "the CPU", working == DType::kBF16 ? "bf16" : "fp32");
  for (const RankMemory& m : memory) std::printf("  %s\n", describe_rank_memory(m).c_str());
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

// The run directory against every path the run reads (core/runtime/output_paths.h): it
// writes metrics.jsonl and the checkpoint directory there, and may hold its inputs
// elsewhere (a dataset inside it); the checkpoint it resumes is its own.
absl::Status check_run_dir(const config::Recipe& recipe, const std::string& recipe_path,
                           const std::string& run_dir, const std::string& resume_from) {
  const config::DataConfig& data = recipe.data();
  std::vector<std::string> sources;
  for (const config::DataSource& source : data.sources()) {
    sources.push_back(source.dataset());
    sources.push_back(source.corpus());
  }
  std::vector<InputPath> inputs = input_paths({{"RECIPE", {recipe_path}},
                                               {"data.dataset", {data.dataset()}},
                                               {"data.corpus", {data.corpus()}},
                                               {"data.sources", sources},
                                               {"train.init_from", {recipe.train().init_from()}}});
  if (!resume_from.empty()) inputs.push_back({"--resume-from", resume_from, /*owned=*/true});
  const OutputPath out =
      output_directory("--run-dir", run_dir, {"metrics.jsonl", recipe.checkpoint().dir()});
  return check_outputs(inputs, {out}, /*overwrite=*/false);
}

absl::StatusOr<TrainEnd> run_train(const std::string& recipe_path, const std::string& run_dir,
                                   const std::vector<std::string>& overrides, bool dry,
                                   int dry_world, double peak_gflops, const std::string& cache_dir,
                                   const std::string& resume_from, bool extend_schedule,
                                   bool op_times) {
  std::string quick_run_warning;
  SY_ASSIGN_OR_RETURN(config::Recipe recipe,
                      config::load_recipe(recipe_path, overrides, &quick_run_warning));
  const MpiRuntime& runtime = MpiRuntime::get();
  if (runtime.world_rank() == 0 && !quick_run_warning.empty())
    std::printf("%s\n", quick_run_warning.c_str());
  // The layout is checked before any work, in a dry run too.
  if (dry) {
    SY_ASSIGN_OR_RETURN(const Layout layout,
                        make_layout(recipe, dry_run_world(recipe, dry_world)));
    if (runtime.world_rank() == 0) SY_RETURN_IF_ERROR(dry_run(recipe, layout));
    return TrainEnd::kFinished;
  }
  SY_ASSIGN_OR_RETURN(const Layout layout, make_layout(recipe, runtime.world_size()));
  if (run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  SY_RETURN_IF_ERROR(check_run_dir(recipe, recipe_path, run_dir, resume_from));
  ProcessGroups groups = make_process_groups(layout);
  // A live progress line on a terminal, plain lines in logs and CI. Under mpirun a
  // rank's stdout is a pseudo-terminal whatever the launcher's own output is, so there
  // the plain lines are the safe choice.
  const bool live = isatty(STDOUT_FILENO) == 1 && !runtime.launched();
  TrainProgressSink sink(stdout, live, terminal_columns(STDOUT_FILENO));
  if (runtime.world_rank() == 0)
    sink.on_message(absl::StrCat("switchyard train: ", config::summarize_recipe(recipe)));
  TrainOptions options;
  options.run_dir = run_dir;
  options.peak = {peak_gflops * 1e9, default_peak_cache_path(), build_info_line()};
  options.local_rank = runtime.local_rank();
  options.dataset_cache_dir = cache_dir;
  options.resume_from = resume_from;
  options.extend_schedule = extend_schedule;
  options.op_times = op_times;
  options.groups = &groups;
  options.threads_per_rank = runtime.launched() ? runtime.threads_per_rank() : 0;
  options.stop_requested = &g_stop_requested;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  return train(recipe, options, sink);
}

// The loss of `dir`'s model on the evaluation windows (engine/train/evaluation.h): those
// of the model's train.eval_tokens, as its training evaluated, or the first
// `max_windows` when given.
absl::Status run_eval(const std::string& dir, const std::string& data, const std::string& split,
                      int64_t max_windows) {
  LoadedModel lm;
  SY_RETURN_IF_ERROR(load_model(dir, lm));
  DatasetOpenOptions open_options;
  open_options.expected_tokenizer_sha256 = lm.tokenizer->sha256();
  open_options.expected_vocab_size = lm.tokenizer->vocab_size();
  open_options.with_documents = lm.recipe.data().document_attention();
  open_options.pad_documents = lm.recipe.data().packing() == config::PAD;
  SY_ASSIGN_OR_RETURN(const TokenDataset dataset, TokenDataset::open(data, split, open_options));
  const int64_t seq = lm.recipe.train().seq_len();
  const int64_t windows = max_windows > 0
                              ? std::min(max_windows, dataset.num_windows(seq))
                              : evaluation_windows(dataset, seq, lm.recipe.train().eval_tokens());
  if (windows == 0)
    return absl::InvalidArgumentError(absl::StrCat(data, ": the ", split,
                                                    " split is shorter than one window of ",
                                                    seq + 1, " tokens"));
  SY_ASSIGN_OR_RETURN(const EvalResult result,
                      evaluate_windows(cpu_device(), *lm.model, dataset, seq, windows, nullptr));
  nlohmann::ordered_json j = {
      {"val_loss", result.loss}, {"tokens", result.tokens}, {"split", split}};
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

// One line on stderr. Under a launcher the failing rank names itself and ends the whole
// job, so no rank is left waiting in a collective for it.
int report(const absl::Status& status) {
  if (status.ok()) return 0;
  const MpiRuntime& runtime = MpiRuntime::get();
  if (runtime.world_size() > 1) {
    std::fprintf(stderr, "switchyard: error (rank %d): %s\n", runtime.world_rank(),
                 escape_control_bytes(std::string(status.message())).c_str());
    std::fflush(stderr);
    abort_job(1);
  }
  std::fprintf(stderr, "switchyard: error: %s\n", escape_control_bytes(std::string(status.message())).c_str());
  return 1;
}

// A finished run exits 0; one stopped by a signal after its checkpoint 128 + the signal.
int train_exit_status(const absl::StatusOr<TrainEnd>& end) {
  if (!end.ok()) return report(end.status());
  return *end == TrainEnd::kStopped ? 128 + g_stop_signal.load() : 0;
}

// --help and --version print and exit 0; any other parse error is one line and exit 1.
int parse_error_status(const CLI::App& app, const CLI::ParseError& error) {
  if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(error);
  return report(absl::InvalidArgumentError(absl::StrCat(error.what(), " (see --help)")));
}

// The last resort for anything that escapes the readers' own checks: an exception, or
// std::terminate (an exception leaving an OpenMP region): one line, exit status 1, and
// the whole job ended under a launcher. The readers never rely on it.
std::string describe_current_exception() {
  try {
    if (const std::exception_ptr e = std::current_exception()) std::rethrow_exception(e);
    return "terminated without an exception";
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    return absl::StrCat("unexpected exception: ", e.what());
  } catch (...) {
    return "unexpected exception of unknown type";
  }
}

[[noreturn]] void on_terminate() {
  report(absl::InternalError(describe_current_exception()));
  std::_Exit(1);
}

int run_main(int argc, char** argv) {
  use_fastest_blas_kernels(argv);
  // Keep large activation buffers in the heap between steps instead of mapping and
  // faulting in fresh pages for every allocation.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  MpiRuntime::initialize(&argc, &argv);

  CLI::App app{"switchyard: training engine for sparse Mixture-of-Experts language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", build_info_line());
  // Every option's --help line shows its default (options made after this inherit it).
  app.option_defaults()->always_capture_default();

  std::string recipe_path, run_dir, cache_dir, resume_from;
  std::vector<std::string> overrides;
  bool dry = false, extend_schedule = false, op_times = false;
  double peak_gflops = 0;
  int dry_world = 0;
  auto* train_cmd = app.add_subcommand("train", "train a recipe");
  train_cmd->add_option("recipe", recipe_path, "recipe file (.textproto)")->required();
  train_cmd->add_option("--run-dir", run_dir, "directory for metrics and weights");
  train_cmd->add_option("--set", overrides, "override a recipe field: path=value (repeatable)");
  train_cmd->add_flag("--dry-run", dry,
                      "print parameter and FLOP counts and the memory of every rank, train "
                      "nothing");
  train_cmd
      ->add_option("--world", dry_world,
                   "ranks of the layout a --dry-run plans (0: the launcher's, else the fewest "
                   "that the recipe's tensor and expert parallel sizes divide)")
      ->transform(integer_in(0, kMaxDryRunWorld));
  train_cmd
      ->add_option("--peak-gflops", peak_gflops,
                   "peak GFLOP/s of all the ranks together, for the MFU (0: a known GPU's "
                   "dense bf16 peak times the ranks, or the CPU's measured sgemm peak, cached "
                   "in ~/.cache/switchyard/peak.json)")
      ->transform(real_in({0, kMaxPeakGflops}));
  train_cmd->add_option("--dataset-cache", cache_dir,
                        "where a data.corpus is prepared on first use (default "
                        "~/.cache/switchyard/datasets)");
  CLI::Option* resume_option = train_cmd->add_option("--resume-from", resume_from,
                        "resume from this checkpoint directory (DIR/checkpoints/step_N) instead "
                        "of the one DIR/checkpoints/latest names");
  train_cmd->add_flag("--extend-schedule", extend_schedule,
                      "resuming, accept a changed train.steps, optimizer.min_lr, optimizer.decay "
                      "or optimizer.router_lr_scale: the decay restarts from the checkpoint's "
                      "learning rate (docs/training.md)");
  train_cmd->add_flag("--op-times", op_times,
                      "time each step's kinds of work (attention, router, dispatch, experts, "
                      "optimizer...): in metrics.jsonl at every logged step, and a table at the "
                      "end (docs/training.md)");
  // Resuming restores a checkpoint's weights, so weights to start from have no place there.
  train_cmd
      ->add_option_function<std::string>(
          "--init-from",
          [&overrides](const std::string& dir) { overrides.push_back("train.init_from=" + dir); },
          "start from these weights (a run's checkpoints/final or a `convert from-hf` output) "
          "instead of a random initialisation; the same as --set train.init_from=DIR")
      ->excludes(resume_option);

  std::string weights_dir, data, split = "val";
  int64_t batches = 0;
  auto* eval_cmd = app.add_subcommand("eval", "print the loss of saved weights on a dataset as JSON");
  eval_cmd->add_option("checkpoint", weights_dir,
                       "weights directory (<run-dir>/checkpoints/final), checkpoint "
                       "(<run-dir>/checkpoints/step_N) or Hugging Face directory")
      ->required();
  eval_cmd->add_option("--data", data, "dataset directory (made by `data prepare`)")->required();
  eval_cmd->add_option("--split", split, "split to evaluate: val or train");
  eval_cmd
      ->add_option("--windows", batches,
                   "evaluate the first N windows of train.seq_len (default: those of the "
                   "model's train.eval_tokens, the set its training evaluated)")
      ->transform(integer_in(0, kMaxEvalWindows));

  DataCommands data_commands(app);
  ConvertCommand convert_command(app);
  BenchCommand bench_command(app);
  PlanCommand plan_command(app);
  SampleCommand sample_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return parse_error_status(app, error);
  }
  if (data_commands.parsed()) return report(data_commands.run());
  if (convert_command.parsed()) return report(convert_command.run());
  if (bench_command.parsed()) return report(bench_command.run());
  if (plan_command.parsed()) return report(plan_command.run());
  if (train_cmd->parsed())
    return train_exit_status(run_train(recipe_path, run_dir, overrides, dry, dry_world,
                                       peak_gflops, cache_dir, resume_from, extend_schedule,
                                       op_times));
  if (eval_cmd->parsed()) return report(run_eval(weights_dir, data, split, batches));
  if (sample_command.parsed()) return report(sample_command.run());
  return 1;
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  using namespace switchyard;
  std::set_terminate(on_terminate);
  try {
    return run_main(argc, argv);
  } catch (...) {
    return report(absl::InternalError(describe_current_exception()));
  }
}
