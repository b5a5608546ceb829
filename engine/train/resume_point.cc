#include "engine/train/resume_point.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/runtime/status_macros.h"
#include "engine/train/training_data.h"

namespace switchyard {

namespace {

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

}  // namespace

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
  // The checkpoint holds the state of the algorithm it was saved with.
  else if (saved.optimizer().algorithm() != recipe.optimizer().algorithm())
    field = "optimizer.algorithm";
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

bool schedule_changed(const config::Recipe& saved, const config::Recipe& recipe) {
  return !changed_schedule(saved, recipe).empty();
}

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

}  // namespace switchyard
