// Pipeline schedules as data: for P stages, V model chunks per stage and m micro-batches,
// the ordered list of what each pipeline rank does in one training step (docs/pipeline.md).
//
// The model's layers are cut into P x V chunks, numbered in depth order. Pipeline rank r
// holds the V chunks r, r + P, r + 2P, ... (Megatron's interleaved placement; V = 1 is
// one contiguous chunk per rank), its local chunk c being model chunk c * P + r. The
// forward of micro-batch i on model chunk k takes chunk k-1's output (or the token ids
// when k = 0) and its backward takes chunk k+1's input gradient (or the loss when k is
// the last chunk), so an activation travels to the rank holding the next chunk and a
// gradient to the rank holding the previous one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace switchyard {

enum class PipelineScheduleKind {
  kGpipe,            // every forward, then every backward (m micro-batches in flight)
  kOneFOneB,         // 1F1B: P - r - 1 forwards, then one forward and one backward in turn
  kInterleaved1F1B,  // 1F1B over V chunks per rank (Narayanan et al. 2021)
};

std::string pipeline_schedule_name(PipelineScheduleKind kind);

struct PipelineShape {
  int stages = 1;          // P
  int virtual_chunks = 1;  // V
  int micro_batches = 1;   // m
  PipelineScheduleKind schedule = PipelineScheduleKind::kOneFOneB;

  int num_chunks() const { return stages * virtual_chunks; }
  // Model chunk of local chunk `chunk` on pipeline rank `rank`, and back.
  int model_chunk(int rank, int chunk) const { return chunk * stages + rank; }
  int rank_of(int model_chunk) const { return model_chunk % stages; }
  int local_chunk(int model_chunk) const { return model_chunk / stages; }
};

// Upper bound on micro-batches x virtual chunks: a step's action list grows with it.
inline constexpr int64_t kMaxPipelineChunkPasses = int64_t{1} << 20;

// One line naming what is wrong, e.g. "parallel.pipeline_schedule INTERLEAVED_1F1B needs
// the micro-batches per step (6) to be a multiple of parallel.pipeline_parallel_size (4)".
absl::Status validate_pipeline_shape(const PipelineShape& shape);

// What moves between pipeline ranks: a chunk's output activation (to the next chunk) or
// the gradient of a chunk's input (to the previous chunk).
enum class TransferKind { kActivation, kGradient };

// One half of a point-to-point message. `chunk` is this rank's local chunk: the one whose
// output (activation) or input gradient a send carries, or the one that will consume what
// a receive brings.
struct Transfer {
  bool send = false;
  TransferKind kind = TransferKind::kActivation;
  int micro_batch = 0;
  int chunk = 0;
  int peer = 0;  // pipeline rank
};

enum class ActionKind {
  kForward,
  kBackward,
  // Posts every transfer at once (receives and sends), then waits for all of them.
  kExchange,
};

struct PipelineAction {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;              // forward, backward
  int chunk = 0;                    // local chunk; forward, backward
  std::vector<Transfer> transfers;  // exchange
};

// The actions of pipeline rank `rank` for one step, in order. `shape` must have passed
// validate_pipeline_shape.
std::vector<PipelineAction> pipeline_actions(const PipelineShape& shape, int rank);

// Most chunk passes of pipeline rank `rank` whose forward has run and whose backward has
// not, over one step of `shape` (which must be valid): the activations the rank holds at
// its peak, in units of one micro-batch through one of its chunks (1/V of its layers).
// GPipe holds all m; 1F1B min(m, P - rank); interleaved
// min(mV, 2(P - rank - 1) + (V - 1)P + 1). A memory plan multiplies it by a chunk's
// activation bytes per micro-batch.
int pipeline_peak_chunk_passes(const PipelineShape& shape, int rank);

// The share of a step each rank idles while the pipeline fills and drains, every pass
// taking the same time: (P - 1) / (mV + P - 1), interleaving cutting the fill by V. What
// the bubble benchmark measures against and `switchyard plan` adds to a step.
double pipeline_bubble_fraction(const PipelineShape& shape);

}  // namespace switchyard
