// Runs one step of a pipeline schedule (pipeline_schedule.h) on this rank: the one
// executor for every schedule. It carries tensors between the passes and the pipeline
// group's messages; what a pass computes is the caller's (PipelineStages).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/tensor.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard {

// What one transfer between two chunks carries: the activation or gradient, and a small
// tensor that travels with it when `side` is defined (the MoE routing sums of
// docs/pipeline.md). The side goes as a second message to the same peer right after
// the first, so both ends must agree on whether there is one.
struct StageMessage {
  StageMessage() = default;
  StageMessage(Tensor tensor, Tensor side = Tensor())  // NOLINT(google-explicit-constructor)
      : tensor(std::move(tensor)), side(std::move(side)) {}
  Tensor tensor;
  Tensor side;
};

// The chunks this rank holds. Chunks are local indices (PipelineShape::model_chunk maps
// them to the model's).
class PipelineStages {
 public:
  virtual ~PipelineStages() = default;
  // Forward of one micro-batch on one chunk. `input` is the previous chunk's output, or
  // undefined on model chunk 0 (which reads the micro-batch itself). Returns the output
  // the next chunk takes; the last model chunk's is not used.
  virtual StageMessage forward(int micro_batch, int chunk, const StageMessage& input) = 0;
  // Backward of a micro-batch whose forward ran on this chunk. `output_grad` is the next
  // chunk's input gradient, or undefined on the last model chunk (whose backward starts
  // from the loss). Returns the gradient of the chunk's input; model chunk 0's is not
  // used.
  virtual StageMessage backward(int micro_batch, int chunk, const StageMessage& output_grad) = 0;
  // Tensors of the shapes and dtypes a message of `kind` for this micro-batch and chunk
  // carries (an activation the chunk takes, a gradient of its output): what a receive
  // fills, its side undefined when none travels with it.
  virtual StageMessage receive_buffer(TransferKind kind, int micro_batch, int chunk) = 0;
};

// One action of a step as it ran on this rank: a pass, or an exchange (posting its
// messages and waiting for all of them: on a rank ahead of its peers, the wait is where
// its share of the bubble shows). Times are seconds on the host's steady clock since
// run_pipeline_step began on this rank; the time between events is the executor's own
// bookkeeping. On a device communicator a span is the time to queue the work, not to run
// it.
enum class PipelineEventKind { kForward, kBackward, kExchange };

struct PipelineEvent {
  PipelineEventKind kind = PipelineEventKind::kForward;
  int micro_batch = -1;  // forward, backward
  int chunk = -1;        // local chunk; forward, backward
  int sends = 0;         // exchange
  int receives = 0;      // exchange
  double start_s = 0;
  double end_s = 0;
};

struct PipelineStepStats {
  // Most micro-batch passes whose forward had run and whose backward had not, on this
  // rank over all its chunks: the activations it held at its peak.
  int peak_in_flight = 0;
  // One per action of pipeline_actions(shape, rank), in order.
  std::vector<PipelineEvent> events;
};

std::string pipeline_event_kind_name(PipelineEventKind kind);

// The events of one step on one pipeline rank as JSON lines, one object per event:
//   {"step":S,"rank":R,"kind":"forward"|"backward"|"exchange","micro_batch":I,"chunk":C,
//    "sends":N,"receives":N,"start_s":T0,"end_s":T1}
// (micro_batch and chunk -1 on an exchange, sends and receives 0 on a pass).
// Callers write them with write_file_atomically (core/runtime/file_util.h).
std::string pipeline_events_json_lines(int step, int rank,
                                       const std::vector<PipelineEvent>& events);

// Runs this rank's actions of `shape` for one step over `pipeline` (its rank is the
// pipeline rank). Every rank of the group must call it with the same shape.
PipelineStepStats run_pipeline_step(const PipelineShape& shape, Communicator& pipeline,
                                    PipelineStages& stages);

}  // namespace switchyard
