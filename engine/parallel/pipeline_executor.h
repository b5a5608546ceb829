// Runs one step of a pipeline schedule (pipeline_schedule.h) on this rank: the one
// executor for every schedule. It carries tensors between the passes and the pipeline
// group's messages; what a pass computes is the caller's (PipelineStages).
#pragma once

#include "engine/parallel/communicator.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/runtime/tensor.h"

namespace switchyard {

// The chunks this rank holds. Chunks are local indices (PipelineShape::model_chunk maps
// them to the model's).
class PipelineStages {
 public:
  virtual ~PipelineStages() = default;
  // Forward of one micro-batch on one chunk. `input` is the previous chunk's output, or
  // undefined on model chunk 0 (which reads the micro-batch itself). Returns the output
  // the next chunk takes; the last model chunk's is not used.
  virtual Tensor forward(int micro_batch, int chunk, const Tensor& input) = 0;
  // Backward of a micro-batch whose forward ran on this chunk. `output_grad` is the next
  // chunk's input gradient, or undefined on the last model chunk (whose backward starts
  // from the loss). Returns the gradient of the chunk's input; model chunk 0's is not
  // used.
  virtual Tensor backward(int micro_batch, int chunk, const Tensor& output_grad) = 0;
  // A tensor of the shape and dtype a message of `kind` for this micro-batch and chunk
  // carries (an activation the chunk takes, a gradient of its output): what a receive
  // fills.
  virtual Tensor receive_buffer(TransferKind kind, int micro_batch, int chunk) = 0;
};

struct PipelineStepStats {
  // Most micro-batch passes whose forward had run and whose backward had not, on this
  // rank over all its chunks: the activations it held at its peak.
  int peak_in_flight = 0;
};

// Runs this rank's actions of `shape` for one step over `pipeline` (its rank is the
// pipeline rank). Every rank of the group must call it with the same shape.
PipelineStepStats run_pipeline_step(const PipelineShape& shape, Communicator& pipeline,
                                    PipelineStages& stages);

}  // namespace switchyard
