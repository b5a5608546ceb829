#include "engine/parallel/pipeline_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/runtime/check.h"

namespace switchyard {
namespace {

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// A forward or backward pass of one micro-batch on one local chunk. A backward that
// `pairs` with the forward before it (interleaved steady phase) shares its slot: no
// exchange between them.
struct Pass {
  bool forward;
  int micro_batch;
  int chunk;
  bool pairs = false;
};

// GPipe and 1F1B: `warmup` forwards, then a forward and a backward in turn, then the
// remaining backwards, one slot each. GPipe is the case warmup = m.
std::vector<Pass> one_chunk_passes(int micro_batches, int warmup) {
  std::vector<Pass> passes;
  for (int i = 0; i < warmup; ++i) passes.push_back({true, i, 0});
  for (int i = 0; i + warmup < micro_batches; ++i) {
    passes.push_back({true, i + warmup, 0});
    passes.push_back({false, i, 0});
  }
  for (int i = std::max(0, micro_batches - warmup); i < micro_batches; ++i)
    passes.push_back({false, i, 0});
  return passes;
}

// Interleaved 1F1B: the step's m x V chunk passes in groups of P micro-batches; virtual
// pass k runs micro-batch (k / PV) * P + k % P on chunk (k % PV) / P (forward) or on the
// chunks in reverse (backward). Its steady phase runs a forward and a backward per slot
// (as Megatron-Core does): with an exchange between them, a rank may wait on an
// activation its neighbour sends only after a backward that waits on this rank.
std::vector<Pass> interleaved_passes(const PipelineShape& shape, int rank) {
  const int p = shape.stages;
  const int v = shape.virtual_chunks;
  const int total = shape.micro_batches * v;
  const int warmup = std::min(total, (p - rank - 1) * 2 + (v - 1) * p);
  auto pass = [p, v](int k, bool forward) {
    const int in_group = k % (p * v);
    const int chunk = forward ? in_group / p : v - 1 - in_group / p;
    return Pass{forward, (k / (p * v)) * p + k % p, chunk, false};
  };
  std::vector<Pass> passes;
  for (int k = 0; k < warmup; ++k) passes.push_back(pass(k, true));
  for (int k = 0; k + warmup < total; ++k) {
    passes.push_back(pass(k + warmup, true));
    passes.push_back(pass(k, false));
    passes.back().pairs = true;
  }
  for (int k = total - warmup; k < total; ++k) passes.push_back(pass(k, false));
  return passes;
}

std::vector<Pass> passes_of(const PipelineShape& shape, int rank) {
  switch (shape.schedule) {
    case PipelineScheduleKind::kGpipe:
      return one_chunk_passes(shape.micro_batches, shape.micro_batches);
    case PipelineScheduleKind::kOneFOneB:
      return one_chunk_passes(shape.micro_batches,
                              std::min(shape.micro_batches, shape.stages - rank - 1));
    case PipelineScheduleKind::kInterleaved1F1B:
      return interleaved_passes(shape, rank);
  }
  SY_CHECK_MSG(false, "unknown pipeline schedule");
}

// What `pass` receives before it can run: the previous chunk's activation (forward) or
// the next chunk's gradient (backward), unless it starts or ends the model.
void append_input(const PipelineShape& shape, int rank, const Pass& pass,
                  std::vector<Transfer>& transfers) {
  const int k = shape.model_chunk(rank, pass.chunk);
  const int from = pass.forward ? k - 1 : k + 1;
  if (from < 0 || from >= shape.num_chunks()) return;
  transfers.push_back({false, pass.forward ? TransferKind::kActivation : TransferKind::kGradient,
                       pass.micro_batch, pass.chunk, shape.rank_of(from)});
}

// What `pass` sends once it has run: its output to the next chunk (forward) or its input
// gradient to the previous one (backward).
void append_output(const PipelineShape& shape, int rank, const Pass& pass,
                   std::vector<Transfer>& transfers) {
  const int k = shape.model_chunk(rank, pass.chunk);
  const int to = pass.forward ? k + 1 : k - 1;
  if (to < 0 || to >= shape.num_chunks()) return;
  transfers.push_back({true, pass.forward ? TransferKind::kActivation : TransferKind::kGradient,
                       pass.micro_batch, pass.chunk, shape.rank_of(to)});
}

void append_exchange(std::vector<Transfer> transfers, std::vector<PipelineAction>& actions) {
  if (transfers.empty()) return;
  PipelineAction exchange;
  exchange.kind = ActionKind::kExchange;
  exchange.transfers = std::move(transfers);
  actions.push_back(std::move(exchange));
}

}  // namespace

std::string pipeline_schedule_name(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::kGpipe:
      return "GPIPE";
    case PipelineScheduleKind::kOneFOneB:
      return "ONE_F_ONE_B";
    case PipelineScheduleKind::kInterleaved1F1B:
      return "INTERLEAVED_1F1B";
  }
  return "unknown";
}

absl::Status validate_pipeline_shape(const PipelineShape& shape) {
  if (shape.stages < 1)
    return invalid(
        absl::StrCat("parallel.pipeline_parallel_size (", shape.stages, ") must be >= 1"));
  if (shape.virtual_chunks < 1)
    return invalid(
        absl::StrCat("parallel.virtual_pipeline_size (", shape.virtual_chunks, ") must be >= 1"));
  if (shape.micro_batches < 1)
    return invalid(absl::StrCat("micro-batches per step (", shape.micro_batches, ") must be >= 1"));
  if (int64_t{shape.micro_batches} * shape.virtual_chunks > kMaxPipelineChunkPasses)
    return invalid(absl::StrCat("micro-batches per step (", shape.micro_batches,
                                ") x parallel.virtual_pipeline_size (", shape.virtual_chunks,
                                ") must be <= ", kMaxPipelineChunkPasses));
  const std::string name = pipeline_schedule_name(shape.schedule);
  if (shape.schedule != PipelineScheduleKind::kInterleaved1F1B) {
    if (shape.virtual_chunks != 1)
      return invalid(absl::StrCat("parallel.pipeline_schedule ", name,
                                  " runs one chunk per rank: parallel.virtual_pipeline_size (",
                                  shape.virtual_chunks,
                                  ") must be 1 (INTERLEAVED_1F1B runs more)"));
    return absl::OkStatus();
  }
  if (shape.stages < 2 || shape.virtual_chunks < 2)
    return invalid(absl::StrCat("parallel.pipeline_schedule ", name,
                                " needs parallel.pipeline_parallel_size (", shape.stages,
                                ") and parallel.virtual_pipeline_size (", shape.virtual_chunks,
                                ") both >= 2"));
  if (shape.micro_batches % shape.stages != 0)
    return invalid(absl::StrCat("parallel.pipeline_schedule ", name,
                                " needs the micro-batches per step (", shape.micro_batches,
                                ") to be a multiple of parallel.pipeline_parallel_size (",
                                shape.stages, "): it runs them in groups of one per stage"));
  return absl::OkStatus();
}

std::vector<PipelineAction> pipeline_actions(const PipelineShape& shape, int rank) {
  SY_CHECK_MSG(validate_pipeline_shape(shape).ok() && rank >= 0 && rank < shape.stages,
               "pipeline_actions of an invalid shape or rank");
  const std::vector<Pass> passes = passes_of(shape, rank);
  std::vector<PipelineAction> actions;
  std::vector<Transfer> transfers;
  // Passes run in slots: one pass, or a forward and the backward paired with it. Each
  // exchange carries the outputs of the slot before it and the inputs of the slot after
  // it, posted together (docs/pipeline.md says why this cannot deadlock).
  for (size_t i = 0; i < passes.size(); ++i) {
    const Pass& pass = passes[i];
    if (!pass.pairs) {
      append_input(shape, rank, pass, transfers);
      if (i + 1 < passes.size() && passes[i + 1].pairs)
        append_input(shape, rank, passes[i + 1], transfers);
      append_exchange(std::move(transfers), actions);
      transfers.clear();
    }
    PipelineAction compute;
    compute.kind = pass.forward ? ActionKind::kForward : ActionKind::kBackward;
    compute.micro_batch = pass.micro_batch;
    compute.chunk = pass.chunk;
    actions.push_back(std::move(compute));
    append_output(shape, rank, pass, transfers);
  }
  append_exchange(std::move(transfers), actions);
  return actions;
}

int pipeline_peak_chunk_passes(const PipelineShape& shape, int rank) {
  SY_CHECK_MSG(validate_pipeline_shape(shape).ok() && rank >= 0 && rank < shape.stages,
               "pipeline_peak_chunk_passes of an invalid shape or rank");
  int held = 0;
  int peak = 0;
  for (const Pass& pass : passes_of(shape, rank)) {
    held += pass.forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

double pipeline_bubble_fraction(const PipelineShape& shape) {
  return static_cast<double>(shape.stages - 1) /
         (static_cast<double>(shape.micro_batches) * shape.virtual_chunks + shape.stages - 1);
}

}  // namespace switchyard
