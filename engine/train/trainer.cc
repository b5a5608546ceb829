#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <google/protobuf/text_format.h>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "engine/config/recipe.h"
#include "engine/model/model_stats.h"
#include "engine/model/transformer.h"
#include "engine/optim/grad_reducer.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/zero.h"
#include "engine/parallel/host_map.h"
#include "engine/runtime/file_util.h"
#include "engine/runtime/status_macros.h"
#include "engine/train/evaluation.h"
#include "engine/train/memory_plan.h"
#include "engine/train/peak.h"
#include "engine/train/pipeline_training.h"
#include "engine/train/rank_state_map.h"
#include "engine/train/record_sinks.h"
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

// The weights a run's first start loads (train.init_from) and their tokenizer, which the
// run tokenises with.
struct InitWeights {
  std::string dir;
  std::string tokenizer_path;
  std::string tokenizer_sha256;
};

// Settings a run started from weights may change: they neither shape nor define the
// model (docs/training.md lists them).
bool may_differ_from_weights(const std::string& field) {
  static const char* const kFields[] = {"model.init_std", "model.max_position_embeddings",
                                        "moe.capacity_factor", "moe.aux_loss_coef",
                                        "moe.z_loss_coef", "moe.aux_loss_per_layer",
                                        "moe.bias_update_rate", "moe.router_force_balance",
                                        "moe.seq_aux_loss_coef"};
  return std::find(std::begin(kFields), std::end(kFields), field) != std::end(kFields);
}

// The first field of `section` ("model" or "moe") where the recipe and the weights'
// recipe differ, refused naming both values.
absl::Status check_same_model_section(const google::protobuf::Message& mine,
                                      const google::protobuf::Message& weights,
                                      const std::string& section, const std::string& dir) {
  const google::protobuf::Descriptor* descriptor = mine.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string name = absl::StrCat(section, ".", field->name());
    if (may_differ_from_weights(name)) continue;
    std::string ours, theirs;
    google::protobuf::TextFormat::PrintFieldValueToString(mine, field, -1, &ours);
    google::protobuf::TextFormat::PrintFieldValueToString(weights, field, -1, &theirs);
    if (ours != theirs)
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is ", ours, " in the recipe but ", theirs, " in the weights of ", dir,
          " (train.init_from): the recipe must describe the weights' model"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<InitWeights>> open_init_weights(const config::Recipe& recipe) {
  if (recipe.train().init_from().empty()) return std::nullopt;
  std::string dir = fs::absolute(recipe.train().init_from()).lexically_normal().string();
  if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  SY_ASSIGN_OR_RETURN(const config::Recipe weights, load_weights_recipe(dir));
  SY_RETURN_IF_ERROR(check_same_model_section(recipe.model(), weights.model(), "model", dir));
  SY_RETURN_IF_ERROR(check_same_model_section(recipe.moe(), weights.moe(), "moe", dir));
  SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, load_weights_tokenizer(dir, weights));
  return InitWeights{dir, dir + "/tokenizer.model", tokenizer.sha256()};
}

// The groups train.freeze may name, each the parts of parameter names it covers.
const std::map<std::string, std::vector<std::string>>& freeze_groups() {
  static const auto* groups = new std::map<std::string, std::vector<std::string>>{
      {"router", {kRouterNamePart}},
      {"embeddings", {"model.embed_tokens."}},
      {"attention", {".self_attn."}},
      {"experts", {".mlp.experts."}},
      {"shared_experts", {".mlp.shared_expert.", ".mlp.shared_expert_gate."}},
      {"norms", {"layernorm.", "model.norm.", "_norm."}},
      {"lm_head", {"lm_head."}}};
  return *groups;
}

// Marks the parameters train.freeze names as frozen; an entry that names none is refused.
// With pipeline stages each rank freezes what it holds, and the counts are the whole
// model's, summed over `pipeline` (a collective over it).
absl::Status apply_freeze(const config::TrainConfig& tc, ParamStore& params,
                          Communicator& pipeline, ProgressSink& sink) {
  std::vector<int64_t> counts = {0, 0};  // frozen, all: elements of the whole tensors
  int64_t& frozen = counts[0];
  for (const Param& p : params.params()) counts[1] += shape_numel(p.whole_shape);
  for (const std::string& entry : tc.freeze()) {
    const auto group = freeze_groups().find(entry);
    const std::vector<std::string> parts =
        group != freeze_groups().end() ? group->second : std::vector<std::string>{entry};
    int64_t matched = 0;
    for (Param& p : params.params()) {
      const bool named = std::any_of(parts.begin(), parts.end(), [&](const std::string& part) {
        return p.name.find(part) != std::string::npos;
      });
      if (!named) continue;
      ++matched;
      if (p.trainable) frozen += shape_numel(p.whole_shape);
      p.trainable = false;
    }
    pipeline.all_reduce_sum(&matched, 1);
    if (matched == 0) {
      std::vector<std::string> names;
      for (const auto& [name, unused] : freeze_groups()) names.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat(
          "train.freeze \"", entry, "\" names no parameter (a group: ", absl::StrJoin(names, ", "),
          "; or a part of parameter names, such as model.layers.0.)"));
    }
  }
  pipeline.all_reduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  if (frozen > 0)
    sink.on_message(absl::StrFormat("frozen by train.freeze: %.3fM of %.3fM parameters",
                                    frozen / 1e6, counts[1] / 1e6));
  return absl::OkStatus();
}

// A setting of the learning-rate schedule, as a recipe gives it.
struct ScheduleSetting {
  enum Kind {
    kPast,         // shapes the curve the run followed: never changes on resume
    kDecayEnd,     // where the decay goes: --extend-schedule restarts it from the checkpoint
    kRouterScale,  // --extend-schedule applies it from the resume step
  };
  std::string name;
  std::string value;
  Kind kind;
};

// The shortest text that reads back as `value` (recipe fields are floats).
std::string float_text(float value) {
  std::string text;
  for (int digits = 6; digits <= 9; ++digits) {
    text = absl::StrFormat("%.*g", digits, value);
    if (std::strtof(text.c_str(), nullptr) == value) break;
  }
  return text;
}

std::vector<ScheduleSetting> schedule_settings(const config::Recipe& recipe) {
  const config::OptimizerConfig& opt = recipe.optimizer();
  const config::LrDecay decay =
      opt.decay() == config::LR_DECAY_UNSPECIFIED ? config::COSINE : opt.decay();
  return {{"train.steps", absl::StrCat(recipe.train().steps()), ScheduleSetting::kDecayEnd},
          {"optimizer.lr", float_text(opt.lr()), ScheduleSetting::kPast},
          {"optimizer.warmup_steps", absl::StrCat(opt.warmup_steps()), ScheduleSetting::kPast},
          {"optimizer.min_lr", float_text(opt.min_lr()), ScheduleSetting::kDecayEnd},
          {"optimizer.decay", config::LrDecay_Name(decay), ScheduleSetting::kDecayEnd},
          {"optimizer.router_lr_scale",
           float_text(opt.has_router_lr_scale() ? opt.router_lr_scale() : 1.0f),
           ScheduleSetting::kRouterScale}};
}

// The schedule settings where the recipe differs from the checkpoint's: (saved, recipe).
std::vector<std::pair<ScheduleSetting, ScheduleSetting>> changed_schedule(
    const config::Recipe& saved, const config::Recipe& recipe) {
  const std::vector<ScheduleSetting> before = schedule_settings(saved);
  const std::vector<ScheduleSetting> now = schedule_settings(recipe);
  std::vector<std::pair<ScheduleSetting, ScheduleSetting>> changed;
  for (size_t i = 0; i < before.size(); ++i)
    if (before[i].value != now[i].value) changed.emplace_back(before[i], now[i]);
  return changed;
}

// A resume keeps the learning-rate schedule the run followed; --extend-schedule lets the
// decay's end and the router's factor change (docs/training.md), never the past curve.
absl::Status check_same_schedule(const config::Recipe& saved, const config::Recipe& recipe,
                                 const std::string& dir, bool extend_schedule) {
  for (const auto& [before, now] : changed_schedule(saved, recipe)) {
    const std::string differs = absl::StrCat(dir, ": ", now.name, " is ", now.value,
                                             " in the recipe but ", before.value,
                                             " in this checkpoint");
    if (before.kind == ScheduleSetting::kPast)
      return absl::FailedPreconditionError(absl::StrCat(
          differs, ": it shapes the learning rates the run already had, so no resume changes "
          "it (--extend-schedule changes train.steps, optimizer.min_lr, optimizer.decay and "
          "optimizer.router_lr_scale); resume with ", now.name, "=", before.value));
    if (!extend_schedule)
      return absl::FailedPreconditionError(absl::StrCat(
          differs, ": a resume keeps the run's learning-rate schedule; pass --extend-schedule "
          "to continue it from this checkpoint's rate (docs/training.md), or resume with ",
          now.name, "=", before.value));
  }
  return absl::OkStatus();
}

// A checkpoint resumes a run of the same model, batch, data order and learning-rate
// schedule; the parallel layout may differ.
absl::Status check_resumable(const checkpoint::Manifest& manifest, const config::Recipe& recipe,
                             const std::string& dir, bool extend_schedule) {
  const config::Recipe& saved = manifest.recipe();
  auto differs = [](const google::protobuf::Message& a, const google::protobuf::Message& b) {
    return a.SerializeAsString() != b.SerializeAsString();
  };
  std::string field;
  if (differs(saved.model(), recipe.model())) field = "model";
  else if (differs(saved.moe(), recipe.moe())) field = "moe";
  else if (saved.train().seq_len() != recipe.train().seq_len()) field = "train.seq_len";
  else if (saved.train().global_batch_size() != recipe.train().global_batch_size())
    field = "train.global_batch_size";
  else if (saved.train().seed() != recipe.train().seed()) field = "train.seed";
  else if (blend_changed(saved.data(), recipe.data())) field = "data.sources";
  if (!field.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": this checkpoint was saved with other ", field,
        " settings; resume with the recipe it was saved with, or use another --run-dir"));
  if (manifest.step() > recipe.train().steps())
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": the checkpoint is at step ", manifest.step(), ", beyond train.steps (",
        recipe.train().steps(), ")"));
  return check_same_schedule(saved, recipe, dir, extend_schedule);
}

// The decay restart a resumed run follows: the checkpoint's own, or, where the decay's
// end changed (--extend-schedule) after warmup, a new one from the rate the run had at
// the checkpoint's step. Within warmup the past curve does not depend on the decay, so
// the recipe's whole schedule applies.
LrRestart resume_lr_restart(const checkpoint::Manifest& manifest, const config::Recipe& recipe) {
  const config::Recipe& saved = manifest.recipe();
  const LrRestart restart{manifest.lr_restart().from_step(), manifest.lr_restart().from_lr()};
  const auto changed = changed_schedule(saved, recipe);
  const bool decay_end_changed = std::any_of(changed.begin(), changed.end(), [](const auto& c) {
    return c.first.kind == ScheduleSetting::kDecayEnd;
  });
  if (!decay_end_changed || manifest.step() <= saved.optimizer().warmup_steps()) return restart;
  return {manifest.step(), learning_rate(saved.optimizer(), manifest.step(),
                                         saved.train().steps(), restart)};
}

// The line a resume with a changed schedule prints: its next and last rates.
std::string describe_extended_schedule(const config::Recipe& recipe, int64_t first_step,
                                       const LrRestart& restart) {
  const config::OptimizerConfig& opt = recipe.optimizer();
  const int64_t last = recipe.train().steps();
  const std::string from =
      restart.from_step > 0
          ? absl::StrFormat("decaying from %.6g, the rate at step %lld, to optimizer.min_lr",
                            restart.from_lr, static_cast<long long>(restart.from_step))
          : std::string("the recipe's schedule");
  return absl::StrFormat(
      "learning-rate schedule changed (--extend-schedule): %.6g at step %lld, %.6g at step "
      "%lld (%s)",
      learning_rate(opt, first_step, last, restart), static_cast<long long>(first_step),
      learning_rate(opt, last, last, restart), static_cast<long long>(last), from);
}

// The checkpoint a run resumes from (dir empty: a fresh start) and its manifest.
struct ResumePoint {
  std::string dir;
  checkpoint::Manifest manifest;
};

absl::StatusOr<ResumePoint> find_resume_point(const std::string& checkpoints_dir,
                                              const std::string& resume_from) {
  ResumePoint point;
  SY_ASSIGN_OR_RETURN(point.dir, checkpoint_to_resume(checkpoints_dir, resume_from));
  if (point.dir.empty()) return point;
  absl::StatusOr<checkpoint::Manifest> manifest = read_manifest(point.dir);
  if (!manifest.ok())
    return with_resume_hint(manifest.status(), checkpoints_dir,
                            std::numeric_limits<int64_t>::max());
  point.manifest = *std::move(manifest);
  return point;
}

// Every rank resumes from the step rank 0 found, decided before training's first
// collective: a rank that found another step (its own view of the run directory) or
// none ends the job with an error instead of mixing steps or hanging.
absl::Status agree_on_resume_step(Communicator& world,
                                  const absl::StatusOr<ResumePoint>& point) {
  enum : int64_t { kUnreadable = 1, kFresh = 2, kResumes = 3 };
  // (what, step) of every rank, each rank filling its own pair.
  std::vector<int64_t> found(2 * static_cast<size_t>(world.size()), 0);
  const size_t mine = 2 * static_cast<size_t>(world.rank());
  found[mine] = !point.ok() ? kUnreadable : point->dir.empty() ? kFresh : kResumes;
  found[mine + 1] = found[mine] == kResumes ? point->manifest.step() : 0;
  world.all_reduce_sum(found.data(), static_cast<int64_t>(found.size()));
  SY_RETURN_IF_ERROR(point.status());
  auto describe = [&](size_t r) {
    return found[2 * r] == kUnreadable ? std::string("could not read its checkpoint")
           : found[2 * r] == kFresh    ? std::string("starts afresh")
                                       : absl::StrCat("resumes from step ", found[2 * r + 1]);
  };
  for (size_t r = 1; r < found.size() / 2; ++r)
    if (found[2 * r] != found[0] || found[2 * r + 1] != found[1])
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " ", describe(r), " but rank 0 ", describe(0),
          "; every rank must see the same run directory"));
  return absl::OkStatus();
}

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

// Puts the loader where the checkpoint's step left it. The manifest is untrusted: a
// blend recomputes its draws step by step, so its position must be that of the step,
// which train.steps bounds.
absl::Status restore_loader(Loader& loader, const checkpoint::Manifest& manifest,
                            int64_t global_batch, const std::string& dir) {
  const LoaderState state{manifest.loader().epoch(), manifest.loader().position(), 0};
  const int64_t windows = loader.windows_per_epoch();
  const int64_t step = manifest.step();
  const auto at_step = [&] {
    return state.epoch >= 0 && state.position >= 0 && state.position < windows && step >= 0 &&
           state.epoch <= (std::numeric_limits<int64_t>::max() - state.position) / windows &&
           step <= std::numeric_limits<int64_t>::max() / global_batch &&
           state.epoch * windows + state.position == step * global_batch;
  };
  if (loader.windows_drawn().size() > 1 && !at_step())
    return absl::DataLossError(absl::StrCat(
        dir, "/manifest.pb: the loader position (epoch ", state.epoch, ", position ",
        state.position, ") is not where step ", step, " of the blend ends (", global_batch,
        " windows per step, ", windows, " per epoch)"));
  return loader.restore(state);
}

// Sums values over the data-parallel group and divides by its size.
void average(Communicator& dp, std::vector<double>& values) {
  dp.all_reduce_sum(values.data(), static_cast<int64_t>(values.size()));
  for (double& v : values) v /= dp.size();
}

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

MemoryRecord memory_record(const MemoryStats& mem) {
  auto peak = [&](MemoryKind k) { return mem.peak_bytes[static_cast<int>(k)]; };
  MemoryRecord r;
  r.parameters = peak(MemoryKind::kParameters);
  r.gradients = peak(MemoryKind::kGradients);
  r.optimizer_state = peak(MemoryKind::kOptimizerState);
  r.expert_parameters = peak(MemoryKind::kExpertParameters);
  r.expert_gradients = peak(MemoryKind::kExpertGradients);
  r.expert_optimizer_state = peak(MemoryKind::kExpertOptimizerState);
  r.activations = peak(MemoryKind::kActivations);
  return r;
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
  const int rank = groups.world->rank();
  const bool reporter = rank == 0;
  RankZeroSink sink(terminal, reporter);
  SY_ASSIGN_OR_RETURN(const Layout layout, make_layout(recipe, groups.world->size()));
  // Gathered while the world communicator is still the host one.
  const std::string rank_hosts = describe_hosts(gather_host_names(*groups.world));

  const auto& tc = recipe.train();
  SY_ASSIGN_OR_RETURN(const std::optional<InitWeights> init, open_init_weights(recipe));
  // Rank 0 prepares a corpus on first use; the others then find it in the cache.
  if (!reporter) groups.world->barrier();
  DataMessages messages(sink);
  SourceDirOptions source_options;
  source_options.dataset_cache_dir = options.dataset_cache_dir;
  if (init) source_options.tokenizer_path = init->tokenizer_path;
  absl::StatusOr<std::vector<SourceDir>> prepared =
      resolve_source_dirs(recipe, source_options, messages);
  if (reporter) groups.world->barrier();
  SY_ASSIGN_OR_RETURN(const std::vector<SourceDir> source_dirs, std::move(prepared));
  DatasetOpenOptions open_options;
  if (init) open_options.expected_tokenizer_sha256 = init->tokenizer_sha256;
  open_options.with_documents = recipe.data().document_attention();
  open_options.pad_documents = recipe.data().packing() == config::PAD;
  SY_ASSIGN_OR_RETURN(const std::vector<TrainingSource> sources,
                      open_training_sources(source_dirs, open_options, tc.eval_interval() > 0,
                                            tc.seq_len(), recipe.model().vocab_size()));
  const bool blend = recipe.data().sources_size() > 0;
  LoaderOptions loader_options;
  loader_options.seq_len = tc.seq_len();
  loader_options.seed = tc.seed();
  loader_options.global_batch = tc.global_batch_size();
  loader_options.dp_rank = layout.dp_index(rank);
  loader_options.dp_size = layout.data_parallel_size;
  loader_options.document_starts = recipe.data().document_attention();
  SY_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader,
                      Loader::create(loader_sources(sources), loader_options));

  const std::string checkpoints_dir =
      (fs::path(options.run_dir) / recipe.checkpoint().dir()).string();
  // The recipe as checkpoints and final weights record it: the datasets it resolved to.
  config::Recipe saved_recipe = recipe;
  config::DataConfig& saved_data = *saved_recipe.mutable_data();
  saved_data.clear_corpus();
  for (size_t i = 0; i < source_dirs.size(); ++i) {
    const std::string dir = saved_path(source_dirs[i].dir, options.run_dir, checkpoints_dir);
    if (!blend) {
      saved_data.set_dataset(dir);
      continue;
    }
    saved_data.mutable_sources(static_cast<int>(i))->clear_corpus();
    saved_data.mutable_sources(static_cast<int>(i))->set_dataset(dir);
  }
  if (init)
    saved_recipe.mutable_train()->set_init_from(
        saved_path(init->dir, options.run_dir, checkpoints_dir));

  const absl::StatusOr<ResumePoint> resume_point =
      find_resume_point(checkpoints_dir, options.resume_from);
  SY_RETURN_IF_ERROR(agree_on_resume_step(*groups.world, resume_point));
  const std::string& resume_dir = resume_point->dir;
  const checkpoint::Manifest& manifest = resume_point->manifest;
  if (!resume_dir.empty())
    SY_RETURN_IF_ERROR(check_resumable(manifest, recipe, resume_dir, options.extend_schedule));
  else if (options.extend_schedule)
    return absl::InvalidArgumentError(absl::StrCat(
        "--extend-schedule continues the learning-rate schedule of a resumed run, but ",
        checkpoints_dir, " holds no checkpoint to resume: drop the flag to start afresh"));

  set_cpu_threads(recipe.runtime().threads() > 0 ? recipe.runtime().threads()
                                                 : options.threads_per_rank);
  std::string device_error;
  Device* device = select_device(recipe.runtime().device(), options.local_rank, &device_error);
  if (device == nullptr) return absl::InvalidArgumentError(device_error);
  Device& dev = *device;
  // Stage-to-stage messages go over the pipeline group's host communicator.
  if (layout.pipeline_parallel_size > 1 && dev.is_cuda())
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.pipeline_parallel_size (", layout.pipeline_parallel_size,
        ") trains on the CPU so far; set runtime.device=cpu (docs/pipeline.md)"));
  const int zero_stage = recipe.parallel().zero_stage();
#ifdef SWITCHYARD_WITH_NCCL
  // On GPUs the groups' collectives go over NCCL, on the tensors where they are.
  if (dev.is_cuda() && layout.world_size > 1) use_nccl(groups, as_cuda(dev));
#endif
  // The MFU's reference; only rank 0 reports it, so only rank 0 finds it.
  Peak peak;
  if (reporter) {
    std::string warning;
    peak = find_peak(options.peak, dev, layout.world_size, &warning);
    if (!warning.empty()) sink.on_message(warning);
    sink.on_message(peak_line(peak));
  }
  const auto& expert_order = recipe.parallel().expert_placement();
  ParamStore params(ShardPlacement{groups.tp->rank(), groups.tp->size(), groups.ep->rank(),
                                   groups.ep->size(),
                                   {expert_order.begin(), expert_order.end()}});
  // This rank's chunks of the model: the whole model without pipeline stages.
  const bool pipelined = layout.pipeline_parallel_size > 1;
  const int pipeline_rank = layout.pp_index(rank);
  const std::vector<std::unique_ptr<Transformer>> chunks = build_model_chunks(
      recipe, layout, pipeline_rank, params, {groups.tp.get(), groups.ep.get()});
  Transformer& model = *chunks.front();
  SY_RETURN_IF_ERROR(apply_freeze(tc, params, *groups.pipeline, sink));
  // ZeRO stages 2 and 3 split the dense gradients and state (and at 3 the values) by
  // rows over the data-parallel replicas.
  std::unique_ptr<ZeroShards> zero;
  if (zero_stage >= 2) {
    zero = std::make_unique<ZeroShards>(params, *groups.dp, zero_stage, dev,
                                        std::move(groups.dp_background),
                                        groups.background_collectives);
    for (const auto& chunk : chunks) chunk->set_param_hooks(zero.get());
  }
  const DType working = working_dtype(recipe.runtime().precision(), dev);
  const double least_bytes =
      rank_memory_lower_bound(recipe, params, working, groups.dp->size()).total();
  SY_RETURN_IF_ERROR(check_fits(
      dev, least_bytes, "this run's parameters, gradients, optimizer state and layer inputs"));
  if (const std::string warning =
          tight_fit_warning(dev.name(), least_bytes, static_cast<double>(dev.available_bytes()));
      !warning.empty())
    sink.on_message(warning);
  params.allocate(dev, working);
  params.initialize(tc.seed());
  if (zero) zero->initialize(tc.seed());
  refresh_working_copies(dev, params);
  // Below stage 2, dense gradients are all-reduced layer by layer as backward finishes
  // each layer, overlapped with the rest of backward (ZeroShards does the same with its
  // reduce-scatters).
  std::unique_ptr<OverlappedGradReduce> reducer;
  if (!zero && groups.dp->size() > 1) {
    reducer = std::make_unique<OverlappedGradReduce>(params, std::move(groups.dp_background),
                                                     groups.background_collectives);
    for (const auto& chunk : chunks) chunk->set_param_hooks(reducer.get());
  }
  AdamWOptimizer::Groups optimizer_groups;
  optimizer_groups.tensor_parallel = groups.tp.get();
  optimizer_groups.expert_parallel = groups.ep.get();
  optimizer_groups.dense_replicas = groups.dp.get();
  optimizer_groups.expert_replicas = groups.expert_dp.get();
  optimizer_groups.zero_stage = zero_stage;
  optimizer_groups.zero = zero.get();
  if (pipelined) optimizer_groups.pipeline = groups.pipeline.get();
  AdamWOptimizer optimizer(recipe.optimizer(), tc.steps(), params, optimizer_groups, dev);
  int64_t first_step = 1;
  LrRestart lr_restart;
  double elapsed_before_s = 0;  // training time of the run's earlier starts
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  if (!resume_dir.empty()) {
    // One read_rows call for everything, so the slices are checksummed in parallel.
    const RankStateMap held(params, zero.get(), zero_stage, &optimizer, groups);
    const StateReads plan = held.reads();
    const absl::Status loaded = read_rows(resume_dir, manifest, plan.reads);
    if (!loaded.ok()) return with_resume_hint(loaded, checkpoints_dir, manifest.step());
    held.cut_tensor_parallel_shards(plan);
    refresh_working_copies(dev, params);
    optimizer.set_steps_taken(manifest.step());
    lr_restart = resume_lr_restart(manifest, recipe);
    optimizer.set_lr_restart(lr_restart);
    SY_RETURN_IF_ERROR(restore_loader(*loader, manifest, tc.global_batch_size(), resume_dir));
    first_step = manifest.step() + 1;
    elapsed_before_s = manifest.elapsed_s();
    sink.on_message(absl::StrCat("resuming from ", resume_dir, " (step ", manifest.step(), ")"));
    if (!changed_schedule(manifest.recipe(), recipe).empty() && first_step <= tc.steps())
      sink.on_message(describe_extended_schedule(recipe, first_step, lr_restart));
  } else if (init) {
    const RankStateMap held(params, zero.get(), zero_stage, nullptr, groups);
    const StateReads plan = held.reads();
    SY_RETURN_IF_ERROR(read_weight_rows(init->dir, plan.reads));
    held.cut_tensor_parallel_shards(plan);
    refresh_working_copies(dev, params);
    sink.on_message(absl::StrCat("starting from the weights in ", init->dir,
                                 " (train.init_from; step 0, fresh optimizer state)"));
  }

  auto save_checkpoint_at = [&](int64_t step) -> absl::Status {
    const std::vector<SliceToSave> mine =
        RankStateMap(params, zero.get(), zero_stage, &optimizer, groups).slices_to_save();
    CheckpointContents contents;
    contents.recipe = saved_recipe;
    contents.layout.set_world_size(layout.world_size);
    contents.layout.set_tensor_parallel_size(layout.tensor_parallel_size);
    contents.layout.set_data_parallel_size(layout.data_parallel_size);
    contents.layout.set_expert_parallel_size(layout.expert_parallel_size);
    contents.layout.set_zero_stage(recipe.parallel().zero_stage());
    contents.step = step;
    const LoaderState position = loader->state();
    contents.loader.set_epoch(position.epoch);
    contents.loader.set_position(position.position);
    contents.elapsed_s =
        elapsed_before_s + std::chrono::duration<double>(clock::now() - start).count();
    if (lr_restart.from_step > 0) {
      contents.lr_restart.emplace();
      contents.lr_restart->set_from_step(lr_restart.from_step);
      contents.lr_restart->set_from_lr(lr_restart.from_lr);
    }
    SY_ASSIGN_OR_RETURN(const std::string dir,
                        save_checkpoint(checkpoints_dir, contents, mine,
                                        recipe.checkpoint().keep(), *groups.world));
    sink.on_message(absl::StrCat("saved checkpoint ", dir));
    return absl::OkStatus();
  };

  const ModelStats stats = compute_model_stats(recipe);
  sink.on_message(absl::StrFormat(
      "model: %.2fM parameters, %.2fM active per token; %d ranks (%s) on %s in %s, %d "
      "threads; data: %s",
      stats.total_params / 1e6, stats.active_params / 1e6, layout.world_size,
      describe_layout(layout, zero_stage), dev.name(),
      working == DType::kBF16 ? "bf16" : "fp32", cpu_threads(),
      describe_training_data(sources)));
  sink.on_message(absl::StrCat("hosts: ", rank_hosts));
  // The terminal, metrics.jsonl and TensorBoard, on the reporting rank only: opened once
  // every refusal that the recipe or the checkpoint can cause has passed, so that a refused
  // run writes nothing into the run directory.
  RecordSinks records;
  if (reporter) {
    SY_ASSIGN_OR_RETURN(records, open_record_sinks(terminal, options.run_dir,
                                                   resume_dir.empty() ? -1 : manifest.step()));
  }

  const int64_t micro = tc.micro_batch_size();
  const int64_t accumulation = layout.micro_batches_per_step;
  // Each micro-batch's mean loss counts 1 / (micro-batches over all ranks) of the step's
  // loss, so the summed gradients equal the single-process ones.
  const int64_t global_micro_batches = accumulation * layout.data_parallel_size;
  const int64_t tokens_per_step = tc.global_batch_size() * tc.seq_len();
  std::vector<Batch> batches;
  for (int64_t m = 0; m < accumulation; ++m)
    batches.push_back(make_batch(micro, tc.seq_len(), recipe.data().document_attention(),
                                 recipe.data().packing() == config::PAD));

  auto window_start = clock::now();
  int64_t window_steps = 0;
  double dropped = 0, assignments = 0, worst_load = 0;
  int64_t skipped_steps = 0;  // by train.skip_non_finite_steps, since this start
  double window_all_to_all_s = 0;  // groups.ep's all-to-all seconds at the window start
  // Each local chunk's routing in the last micro-batch of a pipelined step.
  std::vector<RouterStats> last_router_stats(chunks.size());

  const bool evaluates = tc.eval_interval() > 0;
  std::vector<EvalSource> eval_sources;
  for (const TrainingSource& source : sources)
    if (source.val)
      eval_sources.push_back(
          {source.where.name, &*source.val, source.where.weight,
           evaluation_windows(*source.val, tc.seq_len(), tc.eval_tokens())});
  auto run_eval = [&](int64_t step) -> absl::Status {
    const EvalForward forward = [&](const Tensor& ids, const Tensor& targets,
                                    const Tensor& doc_starts, const Tensor& window_tokens) {
      if (pipelined)
        return pipeline_eval_forward(dev, chunks, layout, *groups.pipeline,
                                     recipe.model().hidden_size(), working, ids, targets,
                                     doc_starts, window_tokens);
      return model.forward(dev, ids, targets, /*training=*/false, Rng(0), nullptr, doc_starts,
                           window_tokens);
    };
    SY_ASSIGN_OR_RETURN(const BlendEvalResult result,
                        evaluate_blend(forward, eval_sources, tc.seq_len(), groups.dp.get()));
    EvalRecord record;
    record.step = step;
    record.val_loss = result.loss;
    if (blend) record.by_source = result.by_source;
    std::vector<RouterStats> chunk_routing;
    for (const auto& chunk : chunks) chunk_routing.push_back(chunk->router_stats());
    const RouterStats layers_routing =
        pipelined ? gather_pipeline_router_stats(recipe, layout, pipeline_rank, chunk_routing,
                                                 *groups.pipeline)
                  : model.router_stats();
    record.router_stats = &layers_routing;
    return records.on_eval(record);
  };
  // The untrained baseline, so every curve starts from a measured point.
  if (evaluates && first_step == 1) SY_RETURN_IF_ERROR(run_eval(0));

  // Loss-free balancing's loads of the step under way (moe.bias_update_rate), one balancer
  // per local chunk: each stage updates the biases of its own layers.
  std::vector<ExpertBiasBalancer> balancers;
  if (recipe.moe().bias_update_rate() > 0)
    balancers.assign(chunks.size(), ExpertBiasBalancer(recipe.moe().bias_update_rate(),
                                                       recipe.moe().num_experts()));
  for (int64_t step = first_step; step <= tc.steps(); ++step) {
    LossParts step_loss;
    // The cross-entropy is the mean over the targets of the whole global batch (loss-masked
    // ones excluded), so every rank needs their count before its first backward.
    int64_t step_targets = 0;
    for (Batch& batch : batches) {
      SY_RETURN_IF_ERROR(
          loader->next_batch(micro, batch.ids.data<int32_t>(), batch.targets.data<int32_t>(),
                             batch.doc_starts.defined() ? batch.doc_starts.data<int32_t>() : nullptr,
                             batch.window_tokens.defined() ? batch.window_tokens.data<int32_t>()
                                                           : nullptr));
      step_targets += count_targets(batch.targets);
    }
    groups.dp->all_reduce_sum(&step_targets, 1);
    const double ce_tokens = static_cast<double>(step_targets) / global_micro_batches;
    double cross_entropy_sum = 0;  // over this rank's targets
    // One forward's losses and routing, on local chunk `chunk`.
    auto count_forward = [&](int chunk, const LossParts& parts, const RouterStats& rs) {
      step_loss.total += (parts.total - parts.cross_entropy) / accumulation;
      cross_entropy_sum += parts.cross_entropy * static_cast<double>(parts.target_tokens);
      step_loss.aux_loss += parts.aux_loss / accumulation;
      step_loss.z_loss += parts.z_loss / accumulation;
      step_loss.seq_aux_loss += parts.seq_aux_loss / accumulation;
      if (!balancers.empty()) balancers[chunk].add(rs);
      dropped += rs.dropped_assignments;
      assignments += rs.assignments;
      worst_load = std::max(worst_load, rs.worst_load_ratio);
    };
    // Random routing decisions (GShard) depend on (seed, step, micro-batch) only, so
    // every parallel layout makes the same ones.
    auto routing_rng = [&](int64_t m) {
      const int64_t global_micro = layout.dp_index(rank) * accumulation + m;
      return Rng(tc.seed()).fork(0x6a7e0000ULL + step * 65537ULL + global_micro);
    };
    const float loss_scale = 1.0f / static_cast<float>(global_micro_batches);
    if (pipelined) {
      std::vector<MicroBatchInput> inputs;
      for (int64_t m = 0; m < accumulation; ++m)
        inputs.push_back({batches[m].ids, batches[m].targets, batches[m].doc_starts,
                          batches[m].window_tokens, routing_rng(m)});
      ChunkStages stages(dev, chunks, inputs, recipe.model().hidden_size(), working, loss_scale,
                         ce_tokens, reducer.get(), [&](int chunk, const LossParts& parts, const RouterStats& rs) {
                           count_forward(chunk, parts, rs);
                           last_router_stats[chunk] = rs;
                         });
      run_pipeline_step(layout.pipeline_shape(), *groups.pipeline, stages);
      // The cross-entropy is the last stage's; every stage adds its layers' aux and z losses.
      std::vector<double> sums = {step_loss.total, step_loss.aux_loss, step_loss.z_loss,
                                  step_loss.seq_aux_loss, cross_entropy_sum};
      groups.pipeline->all_reduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
      step_loss.total = sums[0];
      step_loss.aux_loss = sums[1];
      step_loss.z_loss = sums[2];
      step_loss.seq_aux_loss = sums[3];
      cross_entropy_sum = sums[4];
    }
    for (int64_t m = 0; m < accumulation && !pipelined; ++m) {
      const Batch& batch = batches[m];
      const LossParts parts = model.forward(dev, batch.ids, batch.targets, /*training=*/true,
                                            routing_rng(m), nullptr, batch.doc_starts,
                                            batch.window_tokens);
      if (reducer) reducer->set_reducing(m == accumulation - 1);
      model.backward(dev, loss_scale, ce_tokens);
      count_forward(0, parts, model.router_stats());
    }
    // Dense gradients were reduced layer by layer during the last backward: all-reduced
    // (below stage 2) or reduce-scattered onto their rows' owners (ZeRO-2/3).
    if (reducer) reducer->wait();
    if (zero) zero->wait();
    groups.expert_dp->all_reduce_sum(params.expert_grads());
    groups.dp->all_reduce_sum(&cross_entropy_sum, 1);
    std::vector<double> losses = {step_loss.total, step_loss.aux_loss, step_loss.z_loss,
                                  step_loss.seq_aux_loss};
    average(*groups.dp, losses);
    step_loss.cross_entropy = step_targets > 0 ? cross_entropy_sum / step_targets : 0.0;
    step_loss.total = step_loss.cross_entropy + losses[0];
    step_loss.aux_loss = losses[1];
    step_loss.z_loss = losses[2];
    step_loss.seq_aux_loss = losses[3];
    // The loss and the gradient norm are the same on every rank, so all take one branch.
    StepReport report;
    if (std::isfinite(step_loss.total)) report = optimizer.step(dev);
    else optimizer.skip_step();
    const std::string non_finite = describe_non_finite(step_loss.total, report);
    for (size_t c = 0; c < balancers.size(); ++c) {
      const std::vector<std::vector<float>> updates = balancers[c].take_updates(*groups.dp);
      if (non_finite.empty())
        apply_bias_updates(params, zero.get(), zero_stage, *chunks[c], updates);
    }
    if (!non_finite.empty()) {
      if (!tc.skip_non_finite_steps())
        return absl::InternalError(absl::StrCat(
            "step ", step, ": ", non_finite, "; stopped before any update, the last checkpoint "
            "is intact; lower optimizer.lr, set optimizer.grad_clip, or set "
            "train.skip_non_finite_steps=true to skip such steps"));
      ++skipped_steps;
      SY_RETURN_IF_ERROR(records.on_skipped_step({step, non_finite, skipped_steps}));
    }
    if (step == 1) SY_RETURN_IF_ERROR(records.on_memory(memory_record(dev.memory_stats())));
    ++window_steps;

    if (non_finite.empty() && (step % tc.log_interval() == 0 || step == tc.steps())) {
      const auto now = clock::now();
      const double window_s = std::chrono::duration<double>(now - window_start).count();
      // This start's time: the ETA follows its speed; elapsed_s counts every start's.
      const double session_s = std::chrono::duration<double>(now - start).count();
      StepMetrics m;
      m.step = step;
      m.total_steps = tc.steps();
      m.loss = step_loss.total;
      m.cross_entropy = step_loss.cross_entropy;
      m.aux_loss = step_loss.aux_loss;
      m.z_loss = step_loss.z_loss;
      if (recipe.moe().seq_aux_loss_coef() > 0) m.seq_aux_loss = step_loss.seq_aux_loss;
      m.lr = report.lr;
      m.grad_norm = report.grad_norm;
      m.tokens_per_s = window_s > 0 ? window_steps * tokens_per_step / window_s : 0;
      m.mfu = peak.flops > 0 ? m.tokens_per_s * stats.train_flops_per_token / peak.flops : 0;
      // Drops over every data-parallel replica's micro-batches (a collective: every
      // rank logs at the same steps).
      std::vector<double> routed = {dropped, assignments};
      groups.dp->all_reduce_sum(routed.data(), 2);
      // And over every stage's layers (each pipeline rank its worst in a slot of its own).
      std::vector<double> worst(static_cast<size_t>(groups.pipeline->size()), 0.0);
      worst[groups.pipeline->rank()] = worst_load;
      if (pipelined) {
        groups.pipeline->all_reduce_sum(routed.data(), 2);
        groups.pipeline->all_reduce_sum(worst.data(), static_cast<int64_t>(worst.size()));
      }
      m.dropped_fraction = routed[1] > 0 ? routed[0] / routed[1] : 0;
      m.worst_load_ratio = *std::max_element(worst.begin(), worst.end());
      const double all_to_all_s = groups.ep->all_to_all_seconds();
      m.all_to_all_share = window_s > 0 ? (all_to_all_s - window_all_to_all_s) / window_s : 0;
      window_all_to_all_s = all_to_all_s;
      m.elapsed_s = elapsed_before_s + session_s;
      m.eta_s = session_s / (step - first_step + 1) * (tc.steps() - step);
      if (blend) {
        for (size_t i = 0; i < sources.size(); ++i)
          m.tokens_by_source.emplace_back(sources[i].where.name,
                                          loader->windows_drawn()[i] * tc.seq_len());
      }
      const RouterStats layers_routing =
          pipelined ? gather_pipeline_router_stats(recipe, layout, pipeline_rank,
                                                   last_router_stats, *groups.pipeline)
                    : model.router_stats();
      SY_RETURN_IF_ERROR(records.on_step({m, peak.flops / 1e9, peak.source, &layers_routing}));
      window_start = now;
      window_steps = 0;
      dropped = assignments = worst_load = 0;
    }
    if (evaluates && (step % tc.eval_interval() == 0 || step == tc.steps()))
      SY_RETURN_IF_ERROR(run_eval(step));

    // A stop request on any rank stops every rank at this same step boundary.
    int64_t stop = options.stop_requested && options.stop_requested->load() ? 1 : 0;
    groups.world->all_reduce_sum(&stop, 1);
    const int64_t interval = recipe.checkpoint().interval_steps();
    if ((interval > 0 && step % interval == 0) || step == tc.steps() || stop > 0)
      SY_RETURN_IF_ERROR(save_checkpoint_at(step));
    if (stop > 0 && step < tc.steps()) {
      sink.on_message(absl::StrCat("stopped after step ", step,
                                   "; run the same command again to continue"));
      return TrainEnd::kStopped;
    }
  }
  // The saved weights are whole (collectives, so every rank takes part).
  std::vector<std::pair<std::string, Tensor>> whole =
      RankStateMap(params, zero.get(), zero_stage, nullptr, groups).whole_weights();
  if (pipelined) whole = gather_pipeline_weights(recipe, layout, whole, *groups.pipeline);
  SY_RETURN_IF_ERROR(records.close());
  if (!reporter) return TrainEnd::kFinished;

  const std::string weights_dir =
      (fs::path(options.run_dir) / recipe.checkpoint().dir() / "final").string();
  SY_RETURN_IF_ERROR(
      save_weights(weights_dir, saved_recipe, whole, sources.front().train.tokenizer_path()));
  sink.on_message(absl::StrCat("saved final weights to ", weights_dir));
  return TrainEnd::kFinished;
}

}  // namespace switchyard
