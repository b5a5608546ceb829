#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "core/config/recipe.h"
#include "core/runtime/dir_lock.h"
#include "core/runtime/exact_sum.h"
#include "core/runtime/file_util.h"
#include "core/runtime/op_clock.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "engine/model/model_stats.h"
#include "engine/model/transformer.h"
#include "engine/optim/exact_grads.h"
#include "engine/optim/grad_reducer.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/zero.h"
#include "engine/parallel/host_map.h"
#include "engine/train/evaluation.h"
#include "engine/train/fine_tuning.h"
#include "engine/train/memory_plan.h"
#include "engine/train/op_times_report.h"
#include "engine/train/peak.h"
#include "engine/train/pipeline_training.h"
#include "engine/train/rank_state_map.h"
#include "engine/train/record_sinks.h"
#include "engine/train/resume_point.h"
#include "engine/train/routing_tally.h"
#include "engine/train/training_data.h"
#include "kernels/devices.h"
#include "kernels/threads.h"
#include "moe/balance_stats.h"
#include "moe/expert_bias.h"
#ifdef SWITCHYARD_WITH_NCCL
#include "engine/parallel/nccl_communicator.h"
#endif

namespace switchyard {

namespace fs = std::filesystem;

namespace {

struct Batch {
  Tensor ids, targets;  // (micro_batch, seq) i32
  Tensor doc_starts;    // likewise with data.document_attention, else undefined
  Tensor window_tokens;  // (micro_batch) i32 with data.packing PAD (Transformer::forward)
};

Batch make_batch(int64_t batch, int64_t seq, bool documents, bool padded) {
  return {Tensor::empty({batch, seq}, DType::kI32), Tensor::empty({batch, seq}, DType::kI32),
          documents ? Tensor::empty({batch, seq}, DType::kI32) : Tensor(),
          padded ? Tensor::empty({batch}, DType::kI32) : Tensor()};
}

// The targets that carry loss (the others are kIgnoredTarget).
int64_t count_targets(const Tensor& targets) {
  const int32_t* t = targets.data<int32_t>();
  return std::count_if(t, t + targets.numel(), [](int32_t id) { return id >= 0; });
}

// `path` absolute and normal, without a trailing separator.
fs::path normal_absolute(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

// A path as a saved recipe records it: relative to the saved directory (checkpoints/final
// or a step_N beside it) when it lies inside the run directory, so that the run
// directory can move; else absolute, so that it reads the same from any working
// directory.
std::string saved_path(const std::string& path, const std::string& run_dir,
                       const std::string& checkpoints_dir) {
  const fs::path target = normal_absolute(path);
  const fs::path inside = target.lexically_relative(normal_absolute(run_dir));
  if (inside.empty() || *inside.begin() == "..") return target.string();
  return target.lexically_relative(normal_absolute(checkpoints_dir) / "final").string();
}

// Shows data preparation (first use of a corpus) through the trainer's sink.
class DataMessages : public DataProgressSink {
 public:
  explicit DataMessages(ProgressSink& sink) : sink_(sink) {}
  void on_message(const std::string& text) override { sink_.on_message(text); }

 private:
  ProgressSink& sink_;
};

// Reports only on world rank 0; the other ranks stay silent.
class RankZeroSink : public ProgressSink {
 public:
  RankZeroSink(ProgressSink& sink, bool active) : sink_(sink), active_(active) {}
  void on_step(const StepMetrics& m) override {
    if (active_) sink_.on_step(m);
  }
  void on_eval(int64_t step, double val_loss) override {
    if (active_) sink_.on_eval(step, val_loss);
  }
  void on_source_evals(int64_t step,
                       const std::vector<std::pair<std::string, double>>& losses) override {
    if (active_) sink_.on_source_evals(step, losses);
  }
  void on_message(const std::string& text) override {
    if (active_) sink_.on_message(text);
  }

 private:
  ProgressSink& sink_;
  bool active_;
};

// Loss-free balancing (moe/expert_bias.h): adds each MoE layer's bias update to the
// rows of its bias this rank holds (its own rows at ZeRO stage 3, else the whole value).
void apply_bias_updates(ParamStore& params, ZeroShards* zero, int zero_stage,
                        const Transformer& model,
                        const std::vector<std::vector<float>>& updates) {
  const std::vector<const MoeLayer*> layers = model.moe_layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    Param* bias = layers[l]->expert_bias();
    size_t i = 0;
    while (&params.params()[i] != bias) ++i;
    if (zero_stage < 3) {
      add_bias_update(bias->value, 0, updates[l]);
    } else if (zero->shard(i).rows > 0) {
      add_bias_update(zero->shard(i).value, zero->shard(i).first_row, updates[l]);
    }
  }
}

// What was not finite in a step, first the loss, then the gradients ("" when all was).
std::string describe_non_finite(double loss, const StepReport& report) {
  if (!std::isfinite(loss)) return absl::StrCat("the loss is ", loss);
  if (!report.skipped) return "";
  if (report.non_finite_grad.empty())
    return absl::StrCat("the gradient norm is ", report.grad_norm,
                        " (the non-finite gradient is another rank's)");
  return absl::StrCat("the gradient of ", report.non_finite_grad, " is not finite");
}

MemoryRecord memory_record(const MemoryStats& mem, int pipeline_stage, int pipeline_stages) {
  auto peak = [&](MemoryKind k) { return mem.peak_bytes[static_cast<int>(k)]; };
  MemoryRecord r;
  r.parameters = peak(MemoryKind::kParameters);
  r.gradients = peak(MemoryKind::kGradients);
  r.optimizer_state = peak(MemoryKind::kOptimizerState);
  r.expert_parameters = peak(MemoryKind::kExpertParameters);
  r.expert_gradients = peak(MemoryKind::kExpertGradients);
  r.expert_optimizer_state = peak(MemoryKind::kExpertOptimizerState);
  r.activations = peak(MemoryKind::kActivations);
  r.pipeline_stage = pipeline_stage;
  r.pipeline_stages = pipeline_stages;
  return r;
}

using Clock = std::chrono::steady_clock;

// What every phase of a run shares: the recipe, this rank's place in the layout, where
// the run's files go and where it reports.
struct RunContext {
  RunContext(const config::Recipe& recipe, const TrainOptions& options, ProcessGroups& groups,
             const Layout& layout, ProgressSink& sink)
      : recipe(recipe), tc(recipe.train()), options(options), groups(groups), layout(layout),
        sink(sink), rank(groups.world->rank()), reporter(rank == 0),
        pipelined(layout.pipeline_parallel_size > 1), pipeline_rank(layout.pp_index(rank)),
        checkpoints_dir((fs::path(options.run_dir) / recipe.checkpoint().dir()).string()) {}

  const config::Recipe& recipe;
  const config::TrainConfig& tc;
  const TrainOptions& options;
  ProcessGroups& groups;
  const Layout& layout;
  ProgressSink& sink;  // world rank 0's reports; the other ranks' are silent
  const int rank;
  const bool reporter;
  const bool pipelined;
  const int pipeline_rank;
  const std::string checkpoints_dir;
};

// What a run trains on: its sources, the loader over them (which points into them) and
// the recipe as checkpoints and final weights record it.
struct TrainingData {
  std::vector<TrainingSource> sources;
  std::unique_ptr<Loader> loader;
  config::Recipe saved_recipe;
  bool blend = false;  // data.sources
};

// The run directory's lock (core/runtime/dir_lock.h), taken by the reporting rank before
// anything in the directory is read or written and held until train() returns, so that a
// second job on the same --run-dir (started twice, requeued while this one runs) is
// refused naming this one. The other ranks do not lock: they write their checkpoint shards
// only after collectives with rank 0, that is under its lock.
absl::StatusOr<DirLock> lock_run_dir(const RunContext& run) {
  if (!run.reporter) return DirLock();
  std::string warning;
  SY_ASSIGN_OR_RETURN(DirLock lock, DirLock::acquire(run.options.run_dir, &warning));
  if (!warning.empty()) run.sink.on_message(warning);
  return lock;
}

// Rank 0 prepares a corpus on first use; the others then find it in the cache.
absl::StatusOr<std::vector<SourceDir>> prepare_source_dirs(
    const RunContext& run, const std::optional<InitWeights>& init) {
  if (!run.reporter) run.groups.world->barrier();
  DataMessages messages(run.sink);
  SourceDirOptions source_options;
  source_options.dataset_cache_dir = run.options.dataset_cache_dir;
  if (init) source_options.tokenizer_path = init->tokenizer_path;
  absl::StatusOr<std::vector<SourceDir>> prepared =
      resolve_source_dirs(run.recipe, source_options, messages);
  if (run.reporter) run.groups.world->barrier();
  return prepared;
}

// The recipe as checkpoints and final weights record it: the datasets it resolved to.
config::Recipe recipe_to_save(const RunContext& run, const std::vector<SourceDir>& source_dirs,
                              const std::optional<InitWeights>& init) {
  config::Recipe saved_recipe = run.recipe;
  config::DataConfig& saved_data = *saved_recipe.mutable_data();
  saved_data.clear_corpus();
  for (size_t i = 0; i < source_dirs.size(); ++i) {
    const std::string dir =
        saved_path(source_dirs[i].dir, run.options.run_dir, run.checkpoints_dir);
    if (run.recipe.data().sources_size() == 0) {
      saved_data.set_dataset(dir);
      continue;
    }
    saved_data.mutable_sources(static_cast<int>(i))->clear_corpus();
    saved_data.mutable_sources(static_cast<int>(i))->set_dataset(dir);
  }
  if (init)
    saved_recipe.mutable_train()->set_init_from(
        saved_path(init->dir, run.options.run_dir, run.checkpoints_dir));
  return saved_recipe;
}

// The sources (prepared on first use), this rank's loader over them and the recipe to save.
absl::StatusOr<TrainingData> open_training_data(const RunContext& run,
                                                const std::optional<InitWeights>& init) {
  const config::Recipe& recipe = run.recipe;
  SY_ASSIGN_OR_RETURN(const std::vector<SourceDir> source_dirs, prepare_source_dirs(run, init));
  DatasetOpenOptions open_options;
  if (init) open_options.expected_tokenizer_sha256 = init->tokenizer_sha256;
  open_options.with_documents = recipe.data().document_attention();
  open_options.pad_documents = recipe.data().packing() == config::PAD;
  TrainingData data;
  SY_ASSIGN_OR_RETURN(data.sources,
                      open_training_sources(source_dirs, open_options, run.tc.eval_interval() > 0,
                                            run.tc.seq_len(), recipe.model().vocab_size()));
  data.blend = recipe.data().sources_size() > 0;
  LoaderOptions loader_options;
  loader_options.seq_len = run.tc.seq_len();
  loader_options.seed = run.tc.seed();
  loader_options.global_batch = run.tc.global_batch_size();
  loader_options.dp_rank = run.layout.dp_index(run.rank);
  loader_options.dp_size = run.layout.data_parallel_size;
  loader_options.document_starts = recipe.data().document_attention();
  SY_ASSIGN_OR_RETURN(data.loader, Loader::create(loader_sources(data.sources), loader_options));
  data.saved_recipe = recipe_to_save(run, source_dirs, init);
  return data;
}

// The checkpoint every rank resumes from (dir empty: a fresh start), agreed over the
// world and checked against the recipe.
absl::StatusOr<ResumePoint> agree_resume_point(const RunContext& run) {
  const absl::Status linked = refuse_symlink(run.checkpoints_dir, run.options.run_dir);
  const absl::StatusOr<ResumePoint> point =
      linked.ok() ? find_resume_point(run.checkpoints_dir, run.options.resume_from)
                  : absl::StatusOr<ResumePoint>(linked);
  SY_RETURN_IF_ERROR(agree_on_resume_step(*run.groups.world, point));
  if (!point->dir.empty())
    SY_RETURN_IF_ERROR(
        check_resumable(point->manifest, run.recipe, point->dir, run.options.extend_schedule));
  else if (run.options.extend_schedule)
    return absl::InvalidArgumentError(absl::StrCat(
        "--extend-schedule continues the learning-rate schedule of a resumed run, but ",
        run.checkpoints_dir, " holds no checkpoint to resume: drop the flag to start afresh"));
  return *point;
}

// This rank's device, with the CPU threads it computes with and, on GPUs, the groups'
// collectives over NCCL.
absl::StatusOr<Device*> open_device(const RunContext& run) {
  set_cpu_threads(run.recipe.runtime().threads() > 0 ? run.recipe.runtime().threads()
                                                     : run.options.threads_per_rank);
  set_batch_invariant(run.recipe.runtime().batch_invariant());
  std::string device_error;
  Device* dev = select_device(run.recipe.runtime().device(), run.options.local_rank,
                              &device_error);
  if (dev == nullptr) return absl::InvalidArgumentError(device_error);
  if (dev->is_cuda() && run.recipe.runtime().batch_invariant())
    return absl::InvalidArgumentError(
        "runtime.batch_invariant has CPU kernels only: set runtime.device=cpu, or drop it");
#ifdef SWITCHYARD_WITH_NCCL
  // On GPUs the groups' collectives go over NCCL, on the tensors where they are.
  if (dev->is_cuda() && run.layout.world_size > 1) use_nccl(run.groups, as_cuda(*dev));
#endif
  return dev;
}

// The MFU's reference; only rank 0 reports it, so only rank 0 finds it.
Peak find_run_peak(const RunContext& run, Device& dev) {
  if (!run.reporter) return Peak();
  std::string warning;
  const Peak peak = find_peak(run.options.peak, dev, run.layout.world_size, &warning);
  if (!warning.empty()) run.sink.on_message(warning);
  run.sink.on_message(peak_line(peak));
  return peak;
}

// This rank's part of the model and what trains it: the parameters it holds, its model
// chunks (the whole model without pipeline stages), ZeRO's shards or the overlapped
// gradient reducer, and the optimizer.
struct RankTrainer {
  RankTrainer(const RunContext& run, Device& device)
      : dev(device),
        working(working_dtype(run.recipe.runtime().precision(), device)),
        zero_stage(run.recipe.parallel().zero_stage()),
        params(ShardPlacement{run.groups.tp->rank(), run.groups.tp->size(),
                              run.groups.ep->rank(), run.groups.ep->size(),
                              {run.recipe.parallel().expert_placement().begin(),
                               run.recipe.parallel().expert_placement().end()}}),
        chunks(build_model_chunks(run.recipe, run.layout, run.pipeline_rank, params,
                                  {run.groups.tp.get(), run.groups.ep.get()})) {}

  Transformer& model() const { return *chunks.front(); }
  // What this rank holds, with the optimizer's state (a checkpoint) or without (weights).
  RankStateMap held(ProcessGroups& groups, bool with_optimizer) {
    return RankStateMap(params, zero.get(), zero_stage, with_optimizer ? optimizer.get() : nullptr,
                        groups);
  }

  Device& dev;
  const DType working;
  const int zero_stage;
  ParamStore params;
  const std::vector<std::unique_ptr<Transformer>> chunks;
  std::unique_ptr<ZeroShards> zero;
  std::unique_ptr<OverlappedGradReduce> reducer;
  std::unique_ptr<ExactGrads> exact;  // runtime.batch_invariant: takes the reducers' place
  std::unique_ptr<AdamWOptimizer> optimizer;
};

// The least this rank needs must fit its device; a tight fit is warned about.
absl::Status check_rank_memory(const RunContext& run, const RankTrainer& t) {
  const double least_bytes =
      rank_memory_lower_bound(run.recipe, t.params, t.working, run.groups.dp->size()).total();
  SY_RETURN_IF_ERROR(check_fits(
      t.dev, least_bytes, "this run's parameters, gradients, optimizer state and layer inputs"));
  if (const std::string warning = tight_fit_warning(
          t.dev.name(), least_bytes, static_cast<double>(t.dev.available_bytes()));
      !warning.empty())
    run.sink.on_message(warning);
  return absl::OkStatus();
}

AdamWOptimizer::Groups optimizer_groups(const RunContext& run, const RankTrainer& t) {
  AdamWOptimizer::Groups groups;
  groups.tensor_parallel = run.groups.tp.get();
  groups.expert_parallel = run.groups.ep.get();
  groups.dense_replicas = run.groups.dp.get();
  groups.expert_replicas = run.groups.expert_dp.get();
  groups.zero_stage = t.zero_stage;
  groups.zero = t.zero.get();
  if (run.pipelined) groups.pipeline = run.groups.pipeline.get();
  return groups;
}

// The rank's trainer with its parameters initialised from train.seed: refused before any
// allocation when train.freeze names nothing or the rank's least memory does not fit.
absl::StatusOr<std::unique_ptr<RankTrainer>> build_rank_trainer(const RunContext& run,
                                                                Device& dev) {
  auto t = std::make_unique<RankTrainer>(run, dev);
  SY_RETURN_IF_ERROR(apply_freeze(run.tc, t->params, *run.groups.pipeline, run.sink));
  // ZeRO stages 2 and 3 split the dense gradients and state (and at 3 the values) by
  // rows over the data-parallel replicas.
  if (t->zero_stage >= 2) {
    t->zero = std::make_unique<ZeroShards>(t->params, *run.groups.dp, t->zero_stage, dev,
                                           std::move(run.groups.dp_background),
                                           run.groups.background_collectives,
                                           run.recipe.optimizer());
    for (const auto& chunk : t->chunks) chunk->set_param_hooks(t->zero.get());
  }
  SY_RETURN_IF_ERROR(check_rank_memory(run, *t));
  t->params.allocate(dev, t->working);
  t->params.initialize(run.tc.seed());
  if (t->zero) t->zero->initialize(run.tc.seed());
  refresh_working_copies(dev, t->params);
  // Under runtime.batch_invariant every gradient is summed exactly, after the step's last
  // backward. Otherwise, below stage 2, dense gradients are all-reduced layer by layer as
  // backward finishes each layer, overlapped with the rest of backward (ZeroShards does
  // the same with its reduce-scatters).
  if (run.recipe.runtime().batch_invariant()) {
    t->exact = std::make_unique<ExactGrads>(t->params, dev, *run.groups.dp, *run.groups.expert_dp,
                                            t->zero.get());
    for (const auto& chunk : t->chunks) chunk->set_param_hooks(t->exact.get());
  } else if (!t->zero && run.groups.dp->size() > 1) {
    t->reducer = std::make_unique<OverlappedGradReduce>(
        t->params, std::move(run.groups.dp_background), run.groups.background_collectives);
    for (const auto& chunk : t->chunks) chunk->set_param_hooks(t->reducer.get());
  }
  t->optimizer = std::make_unique<AdamWOptimizer>(run.recipe.optimizer(), run.tc.steps(),
                                                  t->params, optimizer_groups(run, *t), dev);
  return t;
}

// Where this start of the run begins.
struct RunStart {
  Clock::time_point start;  // of this start
  int64_t first_step = 1;
  LrRestart lr_restart;
  double elapsed_before_s = 0;  // training time of the run's earlier starts
};

// The parameters, optimizer state, schedule and loader position of the checkpoint.
absl::StatusOr<RunStart> resume_from_checkpoint(const RunContext& run, RankTrainer& t,
                                                Loader& loader, const ResumePoint& point) {
  const checkpoint::Manifest& manifest = point.manifest;
  // One read_rows call for everything, so the slices are checksummed in parallel.
  const RankStateMap held = t.held(run.groups, /*with_optimizer=*/true);
  const StateReads plan = held.reads();
  const absl::Status loaded = read_rows(point.dir, manifest, plan.reads);
  if (!loaded.ok()) return with_resume_hint(loaded, run.checkpoints_dir, manifest.step());
  held.cut_tensor_parallel_shards(plan);
  refresh_working_copies(t.dev, t.params);
  RunStart s;
  t.optimizer->set_steps_taken(manifest.step());
  s.lr_restart = resume_lr_restart(manifest, run.recipe);
  t.optimizer->set_lr_restart(s.lr_restart);
  SY_RETURN_IF_ERROR(restore_loader(loader, manifest, run.tc.global_batch_size(), point.dir));
  s.first_step = manifest.step() + 1;
  s.elapsed_before_s = manifest.elapsed_s();
  run.sink.on_message(
      absl::StrCat("resuming from ", point.dir, " (step ", manifest.step(), ")"));
  if (schedule_changed(manifest.recipe(), run.recipe) &&
      s.first_step <= run.tc.steps())
    run.sink.on_message(describe_extended_schedule(run.recipe, s.first_step, s.lr_restart));
  return s;
}

// train.init_from's weights, with fresh optimizer state.
absl::Status start_from_weights(const RunContext& run, RankTrainer& t, const InitWeights& init) {
  const RankStateMap held = t.held(run.groups, /*with_optimizer=*/false);
  const StateReads plan = held.reads();
  SY_RETURN_IF_ERROR(read_weight_rows(init.dir, plan.reads));
  held.cut_tensor_parallel_shards(plan);
  refresh_working_copies(t.dev, t.params);
  run.sink.on_message(absl::StrCat("starting from the weights in ", init.dir,
                                   " (train.init_from; step 0, fresh optimizer state)"));
  return absl::OkStatus();
}

// Restores the checkpoint to resume, else loads train.init_from's weights, else keeps the
// initialised ones.
absl::StatusOr<RunStart> start_run(const RunContext& run, RankTrainer& t, Loader& loader,
                                   const ResumePoint& point,
                                   const std::optional<InitWeights>& init) {
  const Clock::time_point start = Clock::now();
  RunStart s;
  if (!point.dir.empty()) {
    SY_ASSIGN_OR_RETURN(s, resume_from_checkpoint(run, t, loader, point));
  } else if (init) {
    SY_RETURN_IF_ERROR(start_from_weights(run, t, *init));
  }
  s.start = start;
  return s;
}

// The start lines: the model, the layout, the device and the data; where the ranks run.
void report_start(const RunContext& run, const RankTrainer& t, const TrainingData& data,
                  const std::string& rank_hosts) {
  const ModelStats stats = compute_model_stats(run.recipe);
  run.sink.on_message(absl::StrFormat(
      "model: %.2fM parameters, %.2fM active per token; %d ranks (%s) on %s in %s, %d "
      "threads; data: %s",
      stats.total_params / 1e6, stats.active_params / 1e6, run.layout.world_size,
      describe_layout(run.layout, t.zero_stage), t.dev.name(),
      t.working == DType::kBF16 ? "bf16" : "fp32", cpu_threads(),
      describe_training_data(data.sources)));
  run.sink.on_message(absl::StrCat("hosts: ", rank_hosts));
}

// Saves the checkpoint of `step` (a collective over the world).
absl::Status save_checkpoint_at(const RunContext& run, RankTrainer& t, const TrainingData& data,
                                const RunStart& s, int64_t step) {
  const std::vector<SliceToSave> mine =
      t.held(run.groups, /*with_optimizer=*/true).slices_to_save();
  CheckpointContents contents;
  contents.recipe = data.saved_recipe;
  contents.layout.set_world_size(run.layout.world_size);
  contents.layout.set_tensor_parallel_size(run.layout.tensor_parallel_size);
  contents.layout.set_data_parallel_size(run.layout.data_parallel_size);
  contents.layout.set_expert_parallel_size(run.layout.expert_parallel_size);
  contents.layout.set_zero_stage(run.recipe.parallel().zero_stage());
  contents.step = step;
  const LoaderState position = data.loader->state();
  contents.loader.set_epoch(position.epoch);
  contents.loader.set_position(position.position);
  contents.elapsed_s =
      s.elapsed_before_s + std::chrono::duration<double>(Clock::now() - s.start).count();
  if (s.lr_restart.from_step > 0) {
    contents.lr_restart.emplace();
    contents.lr_restart->set_from_step(s.lr_restart.from_step);
    contents.lr_restart->set_from_lr(s.lr_restart.from_lr);
  }
  SY_ASSIGN_OR_RETURN(const std::string dir,
                      save_checkpoint(run.checkpoints_dir, contents, mine,
                                      run.recipe.checkpoint().keep(), *run.groups.world));
  run.sink.on_message(absl::StrCat("saved checkpoint ", dir));
  return absl::OkStatus();
}

// The evaluations of the validation set, each recorded with the routing of its last batch.
class Evaluator {
 public:
  Evaluator(const RunContext& run, RankTrainer& t, const TrainingData& data,
            RecordSinks& records)
      : run_(run), t_(t), blend_(data.blend), records_(records) {
    for (const TrainingSource& source : data.sources)
      if (source.val)
        sources_.push_back({source.where.name, &*source.val, source.where.weight,
                            evaluation_windows(*source.val, run.tc.seq_len(),
                                               run.tc.eval_tokens())});
  }

  // A collective over the data-parallel group (and the pipeline's, with stages).
  absl::Status run(int64_t step) {
    SY_ASSIGN_OR_RETURN(const BlendEvalResult result,
                        evaluate_blend(forward(), sources_, run_.tc.seq_len(),
                                       run_.groups.dp.get()));
    EvalRecord record;
    record.step = step;
    record.val_loss = result.loss;
    if (blend_) record.by_source = result.by_source;
    std::vector<RouterStats> chunk_routing;
    for (const auto& chunk : t_.chunks) chunk_routing.push_back(chunk->router_stats());
    const RouterStats layers_routing =
        run_.pipelined ? gather_pipeline_router_stats(run_.recipe, run_.layout,
                                                      run_.pipeline_rank, chunk_routing,
                                                      *run_.groups.pipeline)
                       : t_.model().router_stats();
    record.router_stats = &layers_routing;
    return records_.on_eval(record);
  }

 private:
  // One evaluation batch's forward: through every stage with them, else the whole model.
  EvalForward forward() const {
    return [this](const Tensor& ids, const Tensor& targets, const Tensor& doc_starts,
                  const Tensor& window_tokens) {
      if (run_.pipelined)
        return pipeline_eval_forward(t_.dev, t_.chunks, run_.layout, *run_.groups.pipeline,
                                     run_.recipe.model().hidden_size(), t_.working, ids,
                                     targets, doc_starts, window_tokens);
      return t_.model().evaluate(t_.dev, ids, targets, Rng(0), nullptr, doc_starts,
                                 window_tokens);
    };
  }

  const RunContext& run_;
  RankTrainer& t_;
  const bool blend_;
  RecordSinks& records_;
  std::vector<EvalSource> sources_;
};

// The routing counts and time since the last logged step.
struct ProgressWindow {
  Clock::time_point start;
  int64_t steps = 0;
  double dropped = 0, assignments = 0, worst_load = 0;
  double all_to_all_s = 0;  // groups.ep's all-to-all seconds at the window start
  // Each local chunk's routing in the last micro-batch of a pipelined step.
  std::vector<RouterStats> last_router_stats;
  RoutingTally routing{0, 0};  // every forward's, for the digest
  OpTimes op_times;  // train --op-times: the window's steps' times by kind of work
};

// One step's outcome, the same on every rank.
struct StepResult {
  LossParts loss;
  StepReport report;
  std::string non_finite;     // what was not finite ("" when all was)
  int64_t skipped_steps = 0;  // by train.skip_non_finite_steps, since this start
  OpTimes op_times;           // this rank's, with train --op-times
};

// The step's losses as this rank summed them over its forwards: each micro-batch's terms
// added whole and exactly, so the step's figures have the same bits however the
// micro-batches are spread over ranks and stages (core/runtime/exact_sum.h).
struct StepSums {
  ExactSum router_terms;   // the weighted aux, z and sequence-aux terms of the total
  ExactSum aux, z, seq_aux;  // unweighted
  ExactSum cross_entropy;  // over this rank's targets
  ExactSum mtp;            // the MTP modules' mean cross-entropy, over the same targets

  void add(const LossParts& parts, double mtp_coef) {
    router_terms.add(parts.total - parts.cross_entropy - mtp_coef * parts.mtp_loss);
    aux.add(parts.aux_loss);
    z.add(parts.z_loss);
    seq_aux.add(parts.seq_aux_loss);
    const double tokens = static_cast<double>(parts.target_tokens);
    cross_entropy.add(parts.cross_entropy * tokens);
    mtp.add(parts.mtp_loss * tokens);
  }
  void all_reduce(Communicator& group) {
    for (ExactSum* sum : {&router_terms, &aux, &z, &seq_aux, &cross_entropy, &mtp})
      group.all_reduce_sum(*sum);
  }
};

// One training step on this rank: its micro-batches' forwards and backwards (through the
// pipeline's stages, or one after another), the losses and gradients reduced over the
// ranks, the optimizer step and loss-free balancing's bias updates.
class StepRunner {
 public:
  StepRunner(const RunContext& run, RankTrainer& t, Loader& loader)
      : run_(run), t_(t), loader_(loader),
        accumulation_(run.layout.micro_batches_per_step),
        global_micro_batches_(accumulation_ * run.layout.data_parallel_size) {
    for (int64_t m = 0; m < accumulation_; ++m)
      batches_.push_back(make_batch(run.tc.micro_batch_size(), run.tc.seq_len(),
                                    run.recipe.data().document_attention(),
                                    run.recipe.data().packing() == config::PAD));
    // Loss-free balancing's loads of the step under way (moe.bias_update_rate), one
    // balancer per local chunk: each stage updates the biases of its own layers.
    if (run.recipe.moe().bias_update_rate() > 0)
      balancers_.assign(t.chunks.size(), ExpertBiasBalancer(run.recipe.moe().bias_update_rate(),
                                                            run.recipe.moe().num_experts()));
  }

  // Fails on a loss or gradient that is not finite unless train.skip_non_finite_steps.
  // With train --op-times, the result holds where the step's time went on this rank.
  absl::StatusOr<StepResult> run(int64_t step, ProgressWindow& window) {
    OpClock::take();  // the evaluations and checkpoints between steps are not the step's
    absl::StatusOr<StepResult> result = [&] {
      const OpScope whole(OpKind::kOther, OpPass::kForward, t_.dev);
      return run_step(step, window);
    }();
    if (result.ok()) result->op_times = OpClock::take();
    return result;
  }

 private:
  absl::StatusOr<StepResult> run_step(int64_t step, ProgressWindow& window) {
    SY_ASSIGN_OR_RETURN(const int64_t step_targets, load_micro_batches());
    // Each micro-batch's mean loss counts 1 / (micro-batches over all ranks) of the step's
    // loss, so the summed gradients equal the single-process ones.
    const double ce_tokens = static_cast<double>(step_targets) / global_micro_batches_;
    StepSums sums;
    if (run_.pipelined) run_stages(step, ce_tokens, sums, window);
    else run_micro_batches(step, ce_tokens, sums, window);
    StepResult result;
    result.loss = reduce(sums, step_targets);
    update(result);
    if (!result.non_finite.empty()) {
      if (!run_.tc.skip_non_finite_steps())
        return absl::InternalError(absl::StrCat(
            "step ", step, ": ", result.non_finite, "; stopped before any update, the last "
            "checkpoint is intact; lower optimizer.lr, set optimizer.grad_clip, or set "
            "train.skip_non_finite_steps=true to skip such steps"));
      ++skipped_steps_;
    }
    result.skipped_steps = skipped_steps_;
    return result;
  }

  // The step's micro-batches from the loader, and the count of their targets over the
  // data-parallel group: the cross-entropy is the mean over the targets of the whole
  // global batch (loss-masked ones excluded), so every rank needs it before its first
  // backward.
  absl::StatusOr<int64_t> load_micro_batches() {
    const OpScope scope(OpKind::kData, OpPass::kForward, t_.dev);
    int64_t step_targets = 0;
    for (Batch& batch : batches_) {
      SY_RETURN_IF_ERROR(loader_.next_batch(
          run_.tc.micro_batch_size(), batch.ids.data<int32_t>(), batch.targets.data<int32_t>(),
          batch.doc_starts.defined() ? batch.doc_starts.data<int32_t>() : nullptr,
          batch.window_tokens.defined() ? batch.window_tokens.data<int32_t>() : nullptr));
      step_targets += count_targets(batch.targets);
    }
    run_.groups.dp->all_reduce_sum(&step_targets, 1);
    return step_targets;
  }

  // Random routing decisions (GShard) depend on (seed, step, micro-batch) only, so every
  // parallel layout makes the same ones.
  Rng routing_rng(int64_t step, int64_t m) const {
    const int64_t global_micro = run_.layout.dp_index(run_.rank) * accumulation_ + m;
    return Rng(run_.tc.seed()).fork(0x6a7e0000ULL + step * 65537ULL + global_micro);
  }

  float loss_scale() const { return 1.0f / static_cast<float>(global_micro_batches_); }

  // One forward's losses and routing, on local chunk `chunk`.
  void count_forward(int chunk, const LossParts& parts, const RouterStats& rs, StepSums& sums,
                     ProgressWindow& window) {
    sums.add(parts, config::effective_mtp_loss_coef(run_.recipe.model()));
    if (!balancers_.empty()) balancers_[chunk].add(rs);
    window.dropped += rs.dropped_assignments;
    window.assignments += rs.assignments;
    window.routing.add(chunk_first_moe_layer(run_.recipe, run_.layout, run_.pipeline_rank, chunk),
                       rs);
    window.worst_load = std::max(window.worst_load, rs.worst_load_ratio);
  }

  // The micro-batches through this rank's chunks in the pipeline's schedule.
  void run_stages(int64_t step, double ce_tokens, StepSums& sums, ProgressWindow& window) {
    std::vector<MicroBatchInput> inputs;
    for (int64_t m = 0; m < accumulation_; ++m)
      inputs.push_back({batches_[m].ids, batches_[m].targets, batches_[m].doc_starts,
                        batches_[m].window_tokens, routing_rng(step, m)});
    ChunkStages stages(t_.dev, t_.chunks, inputs, run_.recipe.model().hidden_size(), t_.working,
                       loss_scale(), ce_tokens, t_.reducer.get(),
                       [&](int chunk, const LossParts& parts, const RouterStats& rs) {
                         count_forward(chunk, parts, rs, sums, window);
                         window.last_router_stats[chunk] = rs;
                       });
    run_pipeline_step(run_.layout.pipeline_shape(), *run_.groups.pipeline, stages);
    // Every loss is the last stage's (its chunk adds the whole model's router losses in one
    // process's order); the other stages add zeros.
    sums.all_reduce(*run_.groups.pipeline);
  }

  // The micro-batches one after another through the whole model.
  void run_micro_batches(int64_t step, double ce_tokens, StepSums& sums,
                         ProgressWindow& window) {
    Transformer& model = t_.model();
    for (int64_t m = 0; m < accumulation_; ++m) {
      const Batch& batch = batches_[m];
      const LossParts parts = model.forward(t_.dev, batch.ids, batch.targets, /*training=*/true,
                                            routing_rng(step, m), nullptr, batch.doc_starts,
                                            batch.window_tokens);
      if (t_.reducer) t_.reducer->set_reducing(m == accumulation_ - 1);
      model.backward(t_.dev, loss_scale(), ce_tokens);
      count_forward(0, parts, model.router_stats(), sums, window);
    }
  }

  // The gradients and the step's losses over every rank.
  LossParts reduce(StepSums& sums, int64_t step_targets) {
    const OpScope scope(OpKind::kGradients, OpPass::kBackward, t_.dev);
    // Dense gradients were reduced layer by layer during the last backward: all-reduced
    // (below stage 2) or reduce-scattered onto their rows' owners (ZeRO-2/3); or, under
    // runtime.batch_invariant, all are summed exactly now.
    if (t_.exact) {
      t_.exact->finish();
    } else {
      if (t_.reducer) t_.reducer->wait();
      if (t_.zero) t_.zero->wait();
      run_.groups.expert_dp->all_reduce_sum(t_.params.expert_grads());
    }
    sums.all_reduce(*run_.groups.dp);
    // Each global micro-batch's mean loss counts 1 / (micro-batches over all ranks).
    const double micro_batches = static_cast<double>(global_micro_batches_);
    LossParts loss;
    loss.cross_entropy = step_targets > 0 ? sums.cross_entropy.value() / step_targets : 0.0;
    loss.mtp_loss = step_targets > 0 ? sums.mtp.value() / step_targets : 0.0;
    loss.total = loss.cross_entropy + sums.router_terms.value() / micro_batches +
                 config::effective_mtp_loss_coef(run_.recipe.model()) * loss.mtp_loss;
    loss.aux_loss = sums.aux.value() / micro_batches;
    loss.z_loss = sums.z.value() / micro_batches;
    loss.seq_aux_loss = sums.seq_aux.value() / micro_batches;
    return loss;
  }

  // The optimizer step and the bias updates, both skipped when the loss or the gradients
  // are not finite. The loss and the gradient norm are the same on every rank, so all
  // take one branch.
  void update(StepResult& result) {
    const OpScope scope(OpKind::kOptimizer, OpPass::kBackward, t_.dev);
    if (std::isfinite(result.loss.total)) result.report = t_.optimizer->step(t_.dev);
    else t_.optimizer->skip_step();
    result.non_finite = describe_non_finite(result.loss.total, result.report);
    for (size_t c = 0; c < balancers_.size(); ++c) {
      const std::vector<std::vector<float>> updates = balancers_[c].take_updates(*run_.groups.dp);
      if (result.non_finite.empty())
        apply_bias_updates(t_.params, t_.zero.get(), t_.zero_stage, *t_.chunks[c], updates);
    }
  }

  const RunContext& run_;
  RankTrainer& t_;
  Loader& loader_;
  const int64_t accumulation_;
  const int64_t global_micro_batches_;
  std::vector<Batch> batches_;
  std::vector<ExpertBiasBalancer> balancers_;
  int64_t skipped_steps_ = 0;
};

// The records of each step: a skipped step, the first step's memory peaks, and every
// train.log_interval steps (and at the last) the progress record over the window since
// the last one.
class ProgressLog {
 public:
  ProgressLog(const RunContext& run, const RankTrainer& t, const TrainingData& data,
              const RunStart& start, const Peak& peak, RecordSinks& records)
      : run_(run), t_(t), data_(data), start_(start), peak_(peak), records_(records),
        stats_(compute_model_stats(run.recipe)) {
    window_.start = Clock::now();
    window_.last_router_stats.resize(t.chunks.size());
    window_.routing = RoutingTally(moe_layers_before(run.recipe, run.recipe.model().num_layers()),
                                   run.recipe.moe().num_experts());
  }

  ProgressWindow& window() { return window_; }

  // A logging step's record is a collective: every rank logs at the same steps.
  absl::Status on_step(int64_t step, const StepResult& result) {
    if (!result.non_finite.empty())
      SY_RETURN_IF_ERROR(
          records_.on_skipped_step({step, result.non_finite, result.skipped_steps}));
    if (step == 1)
      SY_RETURN_IF_ERROR(records_.on_memory(memory_record(
          t_.dev.memory_stats(), run_.pipeline_rank, run_.layout.pipeline_parallel_size)));
    ++window_.steps;
    window_.op_times += result.op_times;
    // The first step of a start warms caches and allocators: the summary leaves it out.
    if (step > start_.first_step) {
      run_op_times_ += result.op_times;
      ++run_timed_steps_;
    }
    if (!result.non_finite.empty() ||
        (step % run_.tc.log_interval() != 0 && step != run_.tc.steps()))
      return absl::OkStatus();
    const auto now = Clock::now();
    StepMetrics m = metrics(step, result, now);
    add_routing(m);
    const double window_s = std::chrono::duration<double>(now - window_.start).count();
    const double all_to_all_s = run_.groups.ep->all_to_all_seconds();
    m.all_to_all_share = window_s > 0 ? (all_to_all_s - window_.all_to_all_s) / window_s : 0;
    const RouterStats layers_routing =
        run_.pipelined ? gather_pipeline_router_stats(run_.recipe, run_.layout,
                                                      run_.pipeline_rank,
                                                      window_.last_router_stats,
                                                      *run_.groups.pipeline)
                       : t_.model().router_stats();
    SY_RETURN_IF_ERROR(records_.on_step({m, peak_.flops / 1e9, peak_.source, &layers_routing}));
    window_.start = now;
    window_.steps = 0;
    window_.dropped = window_.assignments = window_.worst_load = 0;
    window_.all_to_all_s = all_to_all_s;
    window_.op_times = {};
    return absl::OkStatus();
  }

  // train --op-times: where this rank's steps went, after the first of this start, as
  // a table of milliseconds per step by kind of work, with the FLOP rate of the kinds
  // that multiply matrices against the MFU's reference peak. Empty without the switch.
  std::string op_times_summary() const {
    if (!OpClock::enabled() || run_timed_steps_ == 0) return "";
    // FLOP rates where each rank runs whole layers (no tensor or pipeline split) on its
    // own tokens' worth of work (the experts' too, on average, under expert parallelism).
    const bool whole_layers =
        run_.layout.tensor_parallel_size == 1 && run_.layout.pipeline_parallel_size == 1;
    const double tokens = static_cast<double>(run_.tc.global_batch_size()) *
                          run_.tc.seq_len() / run_.layout.data_parallel_size;
    return describe_op_times(run_op_times_.divided_by(static_cast<double>(run_timed_steps_)),
                             run_timed_steps_,
                             whole_layers ? stats_.forward_flops_by_kind : OpFlops{}, tokens,
                             peak_.flops / run_.layout.world_size);
  }

 private:
  // The step's losses, rates and times as this rank knows them.
  StepMetrics metrics(int64_t step, const StepResult& result, Clock::time_point now) const {
    const double window_s = std::chrono::duration<double>(now - window_.start).count();
    // This start's time: the ETA follows its speed; elapsed_s counts every start's.
    const double session_s = std::chrono::duration<double>(now - start_.start).count();
    const int64_t tokens_per_step = run_.tc.global_batch_size() * run_.tc.seq_len();
    StepMetrics m;
    m.step = step;
    m.total_steps = run_.tc.steps();
    m.loss = result.loss.total;
    m.cross_entropy = result.loss.cross_entropy;
    m.aux_loss = result.loss.aux_loss;
    m.z_loss = result.loss.z_loss;
    if (run_.recipe.moe().seq_aux_loss_coef() > 0) m.seq_aux_loss = result.loss.seq_aux_loss;
    if (run_.recipe.model().mtp_depth() > 0) m.mtp_loss = result.loss.mtp_loss;
    m.lr = result.report.lr;
    m.grad_norm = result.report.grad_norm;
    m.tokens_per_s = window_s > 0 ? window_.steps * tokens_per_step / window_s : 0;
    m.mfu = peak_.flops > 0 ? m.tokens_per_s * stats_.train_flops_per_token / peak_.flops : 0;
    m.elapsed_s = start_.elapsed_before_s + session_s;
    if (OpClock::enabled() && window_.steps > 0)
      m.op_times = window_.op_times.divided_by(static_cast<double>(window_.steps));
    m.eta_s = session_s / (step - start_.first_step + 1) * (run_.tc.steps() - step);
    if (data_.blend) {
      for (size_t i = 0; i < data_.sources.size(); ++i)
        m.tokens_by_source.emplace_back(data_.sources[i].where.name,
                                        data_.loader->windows_drawn()[i] * run_.tc.seq_len());
    }
    return m;
  }

  // Drops over every data-parallel replica's micro-batches, and over every stage's layers
  // (each pipeline rank its worst in a slot of its own): collectives.
  void add_routing(StepMetrics& m) {
    std::vector<double> routed = {window_.dropped, window_.assignments};
    run_.groups.dp->all_reduce_sum(routed.data(), 2);
    std::vector<double> worst(static_cast<size_t>(run_.groups.pipeline->size()), 0.0);
    worst[run_.groups.pipeline->rank()] = window_.worst_load;
    if (run_.pipelined) {
      run_.groups.pipeline->all_reduce_sum(routed.data(), 2);
      run_.groups.pipeline->all_reduce_sum(worst.data(), static_cast<int64_t>(worst.size()));
    }
    m.dropped_fraction = routed[1] > 0 ? routed[0] / routed[1] : 0;
    m.worst_load_ratio = *std::max_element(worst.begin(), worst.end());
    m.routing_digest = window_.routing.take_digest(
        *run_.groups.dp, run_.pipelined ? run_.groups.pipeline.get() : nullptr);
  }

  const RunContext& run_;
  const RankTrainer& t_;
  const TrainingData& data_;
  const RunStart& start_;
  const Peak& peak_;
  RecordSinks& records_;
  const ModelStats stats_;
  ProgressWindow window_;
  OpTimes run_op_times_;
  int64_t run_timed_steps_ = 0;
};

// Whether `step` is a multiple of a positive `interval` or the run's last.
bool due(int64_t step, int64_t interval, int64_t last) {
  return (interval > 0 && step % interval == 0) || step == last;
}

// A stop request on any rank stops every rank at this same step boundary (a collective
// over the world).
bool stop_requested(const RunContext& run) {
  int64_t stop = run.options.stop_requested && run.options.stop_requested->load() ? 1 : 0;
  run.groups.world->all_reduce_sum(&stop, 1);
  return stop > 0;
}

// The final weights, whole, under <checkpoint.dir>/final with the tokenizer (gathered by
// collectives, so every rank takes part; rank 0 writes), after the records are closed:
// written into final.tmp and renamed into place, so that a link planted at `final` is
// replaced, never written through.
absl::Status save_final_weights(const RunContext& run, RankTrainer& t, const TrainingData& data,
                                RecordSinks& records) {
  std::vector<std::pair<std::string, Tensor>> whole =
      t.held(run.groups, /*with_optimizer=*/false).whole_weights();
  if (run.pipelined)
    whole = gather_pipeline_weights(run.recipe, run.layout, whole, *run.groups.pipeline);
  SY_RETURN_IF_ERROR(records.close());
  if (!run.reporter) return absl::OkStatus();
  const std::string weights_dir = (fs::path(run.checkpoints_dir) / "final").string();
  const std::string tmp_dir = weights_dir + ".tmp";
  SY_RETURN_IF_ERROR(fresh_directory(tmp_dir));
  SY_RETURN_IF_ERROR(save_weights(tmp_dir, data.saved_recipe, whole,
                                  data.sources.front().train.tokenizer_path()));
  SY_RETURN_IF_ERROR(replace_directory(tmp_dir, weights_dir));
  run.sink.on_message(absl::StrCat("saved final weights to ", weights_dir));
  return absl::OkStatus();
}

}  // namespace

std::string describe_layout(const Layout& layout, int zero_stage) {
  const std::string chunks = layout.virtual_pipeline_size > 1
                                 ? absl::StrCat(", V ", layout.virtual_pipeline_size)
                                 : "";
  return absl::StrFormat("dp %d, tp %d, ep %d, pp %d%s, zero %d", layout.data_parallel_size,
                         layout.tensor_parallel_size, layout.expert_parallel_size,
                         layout.pipeline_parallel_size, chunks, zero_stage);
}

absl::StatusOr<TrainEnd> train(const config::Recipe& recipe, const TrainOptions& options,
                               ProgressSink& terminal) {
  ProcessGroups local_groups;
  if (options.groups == nullptr) local_groups = local_process_groups();
  ProcessGroups& groups = options.groups ? *options.groups : local_groups;
  RankZeroSink sink(terminal, groups.world->rank() == 0);
  OpClock::enable(options.op_times);
  SY_ASSIGN_OR_RETURN(const Layout layout, make_layout(recipe, groups.world->size()));
  const RunContext run(recipe, options, groups, layout, sink);
  SY_ASSIGN_OR_RETURN(const DirLock run_dir_lock, lock_run_dir(run));
  // Gathered while the world communicator is still the host one.
  const std::string rank_hosts = describe_hosts(gather_host_names(*groups.world));

  SY_ASSIGN_OR_RETURN(const std::optional<InitWeights> init, open_init_weights(recipe));
  SY_ASSIGN_OR_RETURN(const TrainingData data, open_training_data(run, init));
  SY_ASSIGN_OR_RETURN(const ResumePoint resume, agree_resume_point(run));
  SY_ASSIGN_OR_RETURN(Device* const dev, open_device(run));
  const Peak peak = find_run_peak(run, *dev);
  SY_ASSIGN_OR_RETURN(const std::unique_ptr<RankTrainer> trainer, build_rank_trainer(run, *dev));
  SY_ASSIGN_OR_RETURN(const RunStart start, start_run(run, *trainer, *data.loader, resume, init));
  report_start(run, *trainer, data, rank_hosts);
  // The terminal, metrics.jsonl and TensorBoard, on the reporting rank only: opened once
  // every refusal that the recipe or the checkpoint can cause has passed, so that a refused
  // run writes nothing into the run directory.
  RecordSinks records;
  if (run.reporter) {
    const int64_t resume_step = resume.dir.empty() ? -1 : resume.manifest.step();
    SY_ASSIGN_OR_RETURN(records, open_record_sinks(terminal, options.run_dir, resume_step));
  }

  const config::TrainConfig& tc = recipe.train();
  ProgressLog log(run, *trainer, data, start, peak, records);
  Evaluator evaluator(run, *trainer, data, records);
  const bool evaluates = tc.eval_interval() > 0;
  // The untrained baseline, so every curve starts from a measured point.
  if (evaluates && start.first_step == 1) SY_RETURN_IF_ERROR(evaluator.run(0));
  StepRunner steps(run, *trainer, *data.loader);
  for (int64_t step = start.first_step; step <= tc.steps(); ++step) {
    SY_ASSIGN_OR_RETURN(const StepResult result, steps.run(step, log.window()));
    SY_RETURN_IF_ERROR(log.on_step(step, result));
    if (evaluates && due(step, tc.eval_interval(), tc.steps()))
      SY_RETURN_IF_ERROR(evaluator.run(step));
    const bool stop = stop_requested(run);
    if (due(step, recipe.checkpoint().interval_steps(), tc.steps()) || stop)
      SY_RETURN_IF_ERROR(save_checkpoint_at(run, *trainer, data, start, step));
    if (stop && step < tc.steps()) {
      sink.on_message(absl::StrCat("stopped after step ", step,
                                   "; run the same command again to continue"));
      return TrainEnd::kStopped;
    }
  }
  const std::string op_times = log.op_times_summary();
  if (!op_times.empty()) sink.on_message(op_times);
  SY_RETURN_IF_ERROR(save_final_weights(run, *trainer, data, records));
  return TrainEnd::kFinished;
}

}  // namespace switchyard
