#include "engine/parallel/pipeline_executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace switchyard {
namespace {

// A tensor between a pass and a message: (kind, micro-batch, local chunk).
using Key = std::tuple<TransferKind, int, int>;

StageMessage take(std::map<Key, StageMessage>& messages, const Key& key) {
  auto it = messages.find(key);
  SY_CHECK_MSG(it != messages.end(), "pipeline pass without its input");
  StageMessage message = std::move(it->second);
  messages.erase(it);
  return message;
}

class StepRunner {
 public:
  StepRunner(const PipelineShape& shape, Communicator& pipeline, PipelineStages& stages)
      : shape_(shape), pipeline_(pipeline), stages_(stages), rank_(pipeline.rank()) {}

  PipelineStepStats run() {
    const std::vector<PipelineAction> actions = pipeline_actions(shape_, rank_);
    stats_.events.reserve(actions.size());
    for (const PipelineAction& action : actions) {
      PipelineEvent event = started(action);
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
      event.end_s = seconds();
      stats_.events.push_back(event);
    }
    SY_CHECK_MSG(received_.empty() && to_send_.empty(), "pipeline step left messages behind");
    return stats_;
  }

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // The event of `action`, started now.
  PipelineEvent started(const PipelineAction& action) const {
    PipelineEvent event;
    switch (action.kind) {
      case ActionKind::kExchange:
        event.kind = PipelineEventKind::kExchange;
        for (const Transfer& t : action.transfers) ++(t.send ? event.sends : event.receives);
        break;
      case ActionKind::kForward:
      case ActionKind::kBackward:
        event.kind = action.kind == ActionKind::kForward ? PipelineEventKind::kForward
                                                         : PipelineEventKind::kBackward;
        event.micro_batch = action.micro_batch;
        event.chunk = action.chunk;
        break;
    }
    event.start_s = seconds();
    return event;
  }

  // Each transfer is one message, or two to the same peer when a side travels with it.
  void exchange(const std::vector<Transfer>& transfers) {
    std::vector<Communicator::Message> messages;
    std::vector<std::pair<Key, bool>> receives;  // each received message: its key, a side?
    for (const Transfer& t : transfers) {
      const Key key{t.kind, t.micro_batch, t.chunk};
      StageMessage message =
          t.send ? take(to_send_, key) : stages_.receive_buffer(t.kind, t.micro_batch, t.chunk);
      messages.push_back({t.send, t.peer, std::move(message.tensor)});
      if (!t.send) receives.emplace_back(key, false);
      if (!message.side.defined()) continue;
      messages.push_back({t.send, t.peer, std::move(message.side)});
      if (!t.send) receives.emplace_back(key, true);
    }
    pipeline_.exchange(messages);
    size_t next = 0;
    for (const Communicator::Message& m : messages) {
      if (m.send) continue;
      const auto& [key, side] = receives[next++];
      (side ? received_[key].side : received_[key].tensor) = m.tensor;
    }
  }

  void forward(int micro_batch, int chunk) {
    const int k = shape_.model_chunk(rank_, chunk);
    const Key key{TransferKind::kActivation, micro_batch, chunk};
    const StageMessage input = k > 0 ? take(received_, key) : StageMessage();
    StageMessage output = stages_.forward(micro_batch, chunk, input);
    if (k + 1 < shape_.num_chunks()) to_send_[key] = std::move(output);
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
  }

  void backward(int micro_batch, int chunk) {
    const int k = shape_.model_chunk(rank_, chunk);
    const Key key{TransferKind::kGradient, micro_batch, chunk};
    const StageMessage output_grad =
        k + 1 < shape_.num_chunks() ? take(received_, key) : StageMessage();
    StageMessage input_grad = stages_.backward(micro_batch, chunk, output_grad);
    if (k > 0) to_send_[key] = std::move(input_grad);
    --in_flight_;
  }

  const PipelineShape& shape_;
  Communicator& pipeline_;
  PipelineStages& stages_;
  const int rank_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::map<Key, StageMessage> received_;  // inputs of passes still to run
  std::map<Key, StageMessage> to_send_;   // outputs of passes run, for the next exchange
  int in_flight_ = 0;
  PipelineStepStats stats_;
};

}  // namespace

std::string pipeline_event_kind_name(PipelineEventKind kind) {
  switch (kind) {
    case PipelineEventKind::kForward:
      return "forward";
    case PipelineEventKind::kBackward:
      return "backward";
    case PipelineEventKind::kExchange:
      return "exchange";
  }
  return "unknown";
}

std::string pipeline_events_json_lines(int step, int rank,
                                       const std::vector<PipelineEvent>& events) {
  std::string lines;
  for (const PipelineEvent& e : events) {
    const nlohmann::ordered_json line = {{"step", step},
                                         {"rank", rank},
                                         {"kind", pipeline_event_kind_name(e.kind)},
                                         {"micro_batch", e.micro_batch},
                                         {"chunk", e.chunk},
                                         {"sends", e.sends},
                                         {"receives", e.receives},
                                         {"start_s", e.start_s},
                                         {"end_s", e.end_s}};
    lines += line.dump() + "\n";
  }
  return lines;
}

PipelineStepStats run_pipeline_step(const PipelineShape& shape, Communicator& pipeline,
                                    PipelineStages& stages) {
  SY_CHECK_MSG(pipeline.size() == shape.stages, "pipeline group and shape disagree on stages");
  return StepRunner(shape, pipeline, stages).run();
}

}  // namespace switchyard
