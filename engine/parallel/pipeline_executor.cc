#include "engine/parallel/pipeline_executor.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace switchyard {
namespace {

// A tensor between a pass and a message: (kind, micro-batch, local chunk).
using Key = std::tuple<TransferKind, int, int>;

Tensor take(std::map<Key, Tensor>& tensors, const Key& key) {
  auto it = tensors.find(key);
  SY_CHECK_MSG(it != tensors.end(), "pipeline pass without its input");
  Tensor tensor = std::move(it->second);
  tensors.erase(it);
  return tensor;
}

class StepRunner {
 public:
  StepRunner(const PipelineShape& shape, Communicator& pipeline, PipelineStages& stages)
      : shape_(shape), pipeline_(pipeline), stages_(stages), rank_(pipeline.rank()) {}

  PipelineStepStats run() {
    for (const PipelineAction& action : pipeline_actions(shape_, rank_)) {
      switch (action.kind) {
        case ActionKind::kExchange:
          exchange(action.transfers);
          break;
        case ActionKind::kForward:
          forward(action.micro_batch, action.chunk);
          break;
        case ActionKind::kBackward:
          backward(action.micro_batch, action.chunk);
          break;
      }
    }
    SY_CHECK_MSG(received_.empty() && to_send_.empty(), "pipeline step left messages behind");
    return stats_;
  }

 private:
  void exchange(const std::vector<Transfer>& transfers) {
    std::vector<Communicator::Message> messages;
    std::vector<Key> receives;
    for (const Transfer& t : transfers) {
      const Key key{t.kind, t.micro_batch, t.chunk};
      if (t.send) {
        messages.push_back({true, t.peer, take(to_send_, key)});
      } else {
        messages.push_back({false, t.peer, stages_.receive_buffer(t.kind, t.micro_batch, t.chunk)});
        receives.push_back(key);
      }
    }
    pipeline_.exchange(messages);
    size_t next = 0;
    for (const Communicator::Message& m : messages)
      if (!m.send) received_[receives[next++]] = m.tensor;
  }

  void forward(int micro_batch, int chunk) {
    const int k = shape_.model_chunk(rank_, chunk);
    const Key key{TransferKind::kActivation, micro_batch, chunk};
    const Tensor input = k > 0 ? take(received_, key) : Tensor();
    Tensor output = stages_.forward(micro_batch, chunk, input);
    if (k + 1 < shape_.num_chunks()) to_send_[key] = std::move(output);
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
  }

  void backward(int micro_batch, int chunk) {
    const int k = shape_.model_chunk(rank_, chunk);
    const Key key{TransferKind::kGradient, micro_batch, chunk};
    const Tensor output_grad = k + 1 < shape_.num_chunks() ? take(received_, key) : Tensor();
    Tensor input_grad = stages_.backward(micro_batch, chunk, output_grad);
    if (k > 0) to_send_[key] = std::move(input_grad);
    --in_flight_;
  }

  const PipelineShape& shape_;
  Communicator& pipeline_;
  PipelineStages& stages_;
  const int rank_;
  std::map<Key, Tensor> received_;  // inputs of passes still to run
  std::map<Key, Tensor> to_send_;   // outputs of passes run, for the next exchange
  int in_flight_ = 0;
  PipelineStepStats stats_;
};

}  // namespace

PipelineStepStats run_pipeline_step(const PipelineShape& shape, Communicator& pipeline,
                                    PipelineStages& stages) {
  SY_CHECK_MSG(pipeline.size() == shape.stages, "pipeline group and shape disagree on stages");
  return StepRunner(shape, pipeline, stages).run();
}

}  // namespace switchyard
