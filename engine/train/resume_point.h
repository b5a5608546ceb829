// Resuming a run: the checkpoint every rank resumes from, whether the recipe may resume
// it, and the learning-rate schedule and loader position the run continues with.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "core/comm/communicator.h"
#include "core/config/recipe.pb.h"
#include "data/loader.h"
#include "engine/optim/optimizer.h"

namespace switchyard {

// The checkpoint a run resumes from (dir empty: a fresh start) and its manifest.
struct ResumePoint {
  std::string dir;
  checkpoint::Manifest manifest;
};

// The checkpoint under checkpoints_dir to resume from (`resume_from` when given, else the
// one `latest` names) and its manifest; one that cannot be read is refused, naming the
// newest complete one.
absl::StatusOr<ResumePoint> find_resume_point(const std::string& checkpoints_dir,
                                              const std::string& resume_from);

// A checkpoint resumes a run of the same model, batch, data order and learning-rate
// schedule; the parallel layout may differ.
absl::Status check_resumable(const checkpoint::Manifest& manifest, const config::Recipe& recipe,
                             const std::string& dir, bool extend_schedule);

// Whether the recipe's learning-rate schedule differs from the checkpoint's (a resume
// with --extend-schedule).
bool schedule_changed(const config::Recipe& saved, const config::Recipe& recipe);

// The decay restart a resumed run follows: the checkpoint's own, or, where the decay's
// end changed (--extend-schedule) after warmup, a new one from the rate the run had at
// the checkpoint's step. Within warmup the past curve does not depend on the decay, so
// the recipe's whole schedule applies.
LrRestart resume_lr_restart(const checkpoint::Manifest& manifest, const config::Recipe& recipe);

// The line a resume with a changed schedule prints: its next and last rates.
std::string describe_extended_schedule(const config::Recipe& recipe, int64_t first_step,
                                       const LrRestart& restart);

// Every rank resumes from the step rank 0 found, decided before training's first
// collective: a rank that found another step (its own view of the run directory) or
// none ends the job with an error instead of mixing steps or hanging.
absl::Status agree_on_resume_step(Communicator& world,
                                  const absl::StatusOr<ResumePoint>& point);

// Puts the loader where the checkpoint's step left it. The manifest is untrusted: a
// blend recomputes its draws step by step, so its position must be that of the step,
// which train.steps bounds.
absl::Status restore_loader(Loader& loader, const checkpoint::Manifest& manifest,
                            int64_t global_batch, const std::string& dir);

}  // namespace switchyard
