// The pipeline executor (pipeline_executor.h) on a toy model of P x V chunks, the world
// being the pipeline: every schedule's gradients equal one process's bit for bit, and
// each rank holds no more micro-batches than its schedule promises; the events recorded
// are one ordered span per action.
#include "engine/parallel/pipeline_executor.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/parallel/parallel_test_env.h"

namespace switchyard {
namespace {

constexpr int kWidth = 4;

// Chunk k computes y = tanh(w_k x) element-wise; the loss of a micro-batch is
// sum(y^2) / 2 of the last chunk's output. Micro-batch i's input is fixed by i.
// Each value one rounding of an exact integer: float sums of products would give the
// compiler room to fuse a multiply and an add in one caller and not in another.
float weight(int model_chunk, int j) { return (50 + 10 * model_chunk - 5 * j) / 100.0f; }
float input(int micro_batch, int j) { return (30 * micro_batch - 20 * j + 10) / 100.0f; }

struct Saved {
  std::vector<float> x, y;
  float side = 0;  // the side this chunk's forward sent on (ToyStages)
};

// Not inlined, here or in backward: one compiled body serves the executor and the
// reference alike, fused multiply-adds or not.
[[gnu::noinline]] std::vector<float> chunk_forward(int model_chunk, const std::vector<float>& x) {
  std::vector<float> y(kWidth);
  for (int j = 0; j < kWidth; ++j) y[j] = std::tanh(weight(model_chunk, j) * x[j]);
  return y;
}

// Accumulates the weight gradient into `dw`; returns the input gradient.
[[gnu::noinline]] std::vector<float> chunk_backward(int model_chunk, const Saved& saved,
                                                   const std::vector<float>& dy,
                                                   std::vector<float>& dw) {
  std::vector<float> dx(kWidth);
  for (int j = 0; j < kWidth; ++j) {
    const float dz = dy[j] * (1.0f - saved.y[j] * saved.y[j]);
    dw[j] += dz * saved.x[j];
    dx[j] = dz * weight(model_chunk, j);
  }
  return dx;
}

// Odd micro-batches carry a side with each message: forward, the sum of (100 i + k) over
// the model chunks k run so far; backward, the sum over all of them, from the last chunk.
bool has_side(int micro_batch) { return micro_batch % 2 == 1; }
float side_total(int micro_batch, int chunks) {
  return static_cast<float>(100 * micro_batch * chunks + chunks * (chunks - 1) / 2);
}

class ToyStages final : public PipelineStages {
 public:
  ToyStages(const PipelineShape& shape, int rank)
      : shape_(shape), rank_(rank), grads_(shape.virtual_chunks, std::vector<float>(kWidth)) {}

  StageMessage forward(int micro_batch, int chunk, const StageMessage& in) override {
    const int k = shape_.model_chunk(rank_, chunk);
    Saved& saved = saved_[{micro_batch, chunk}];
    if (k == 0) {
      for (int j = 0; j < kWidth; ++j) saved.x.push_back(input(micro_batch, j));
    } else {
      saved.x = testing::values_of<float>(in.tensor);
    }
    saved.y = chunk_forward(k, saved.x);
    const Tensor y = testing::host_tensor<float>({kWidth}, saved.y);
    if (!has_side(micro_batch)) return y;
    const float before = k == 0 ? 0.0f : testing::values_of<float>(in.side).at(0);
    saved.side = before + static_cast<float>(100 * micro_batch + k);
    return {y, testing::host_tensor<float>({1}, {saved.side})};
  }

  StageMessage backward(int micro_batch, int chunk, const StageMessage& output_grad) override {
    const int k = shape_.model_chunk(rank_, chunk);
    const bool last = k + 1 == shape_.num_chunks();
    auto it = saved_.find({micro_batch, chunk});
    EXPECT_NE(it, saved_.end());
    const std::vector<float> dy =
        last ? it->second.y : testing::values_of<float>(output_grad.tensor);
    const std::vector<float> dx = chunk_backward(k, it->second, dy, grads_[chunk]);
    const float total = it->second.side;
    saved_.erase(it);
    const Tensor grad = testing::host_tensor<float>({kWidth}, dx);
    if (!has_side(micro_batch)) return grad;
    const float carried = last ? total : testing::values_of<float>(output_grad.side).at(0);
    EXPECT_EQ(carried, side_total(micro_batch, shape_.num_chunks()))
        << "micro-batch " << micro_batch;
    return {grad, testing::host_tensor<float>({1}, {carried})};
  }

  StageMessage receive_buffer(TransferKind, int micro_batch, int) override {
    return {Tensor::empty({kWidth}, DType::kF32),
            has_side(micro_batch) ? Tensor::empty({1}, DType::kF32) : Tensor()};
  }

  const std::vector<float>& grad(int chunk) const { return grads_[chunk]; }

 private:
  PipelineShape shape_;
  int rank_;
  std::map<std::pair<int, int>, Saved> saved_;
  std::vector<std::vector<float>> grads_;  // per local chunk
};

// One process: every micro-batch through every chunk and back, in micro-batch order.
std::vector<std::vector<float>> reference_grads(int chunks, int micro_batches) {
  std::vector<std::vector<float>> grads(chunks, std::vector<float>(kWidth));
  for (int i = 0; i < micro_batches; ++i) {
    std::vector<Saved> saved(chunks);
    std::vector<float> x(kWidth);
    for (int j = 0; j < kWidth; ++j) x[j] = input(i, j);
    for (int k = 0; k < chunks; ++k) {
      saved[k].x = x;
      saved[k].y = chunk_forward(k, x);
      x = saved[k].y;
    }
    std::vector<float> dy = x;
    for (int k = chunks - 1; k >= 0; --k) dy = chunk_backward(k, saved[k], dy, grads[k]);
  }
  return grads;
}

// The shapes every test runs on a pipeline of `p` ranks.
std::vector<PipelineShape> shapes_for(int p) {
  std::vector<PipelineShape> shapes;
  for (int m : {1, 3, 8}) {
    shapes.push_back({p, 1, m, PipelineScheduleKind::kGpipe});
    shapes.push_back({p, 1, m, PipelineScheduleKind::kOneFOneB});
  }
  if (p > 1)
    for (int v : {2, 3}) shapes.push_back({p, v, 2 * p, PipelineScheduleKind::kInterleaved1F1B});
  return shapes;
}

TEST(PipelineExecutorTest, EveryScheduleMatchesOneProcessAndBoundsItsMicroBatches) {
  Communicator& world = testing::world();
  const int p = world.size();
  const int rank = world.rank();
  for (const PipelineShape& shape : shapes_for(p)) {
    SCOPED_TRACE(pipeline_schedule_name(shape.schedule) +
                 " V=" + std::to_string(shape.virtual_chunks) +
                 " m=" + std::to_string(shape.micro_batches));
    ToyStages stages(shape, rank);
    const PipelineStepStats stats = run_pipeline_step(shape, world, stages);
    const auto reference = reference_grads(shape.num_chunks(), shape.micro_batches);
    for (int c = 0; c < shape.virtual_chunks; ++c)
      EXPECT_EQ(stages.grad(c), reference[shape.model_chunk(rank, c)]) << "chunk " << c;
    EXPECT_EQ(stats.peak_in_flight, pipeline_peak_chunk_passes(shape, rank));
    if (shape.schedule == PipelineScheduleKind::kGpipe) {
      EXPECT_EQ(stats.peak_in_flight, shape.micro_batches);
    }
    if (shape.schedule == PipelineScheduleKind::kOneFOneB) {
      EXPECT_EQ(stats.peak_in_flight, std::min(shape.micro_batches, p - rank));
    }
  }
}

TEST(PipelineExecutorTest, RecordsOneOrderedSpanPerAction) {
  Communicator& world = testing::world();
  for (const PipelineShape& shape : shapes_for(world.size())) {
    SCOPED_TRACE(pipeline_schedule_name(shape.schedule) +
                 " m=" + std::to_string(shape.micro_batches));
    ToyStages stages(shape, world.rank());
    const std::vector<PipelineEvent> events = run_pipeline_step(shape, world, stages).events;
    const std::vector<PipelineAction> actions = pipeline_actions(shape, world.rank());
    ASSERT_EQ(events.size(), actions.size());
    double previous_end = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      const PipelineEvent& e = events[i];
      const PipelineAction& a = actions[i];
      EXPECT_GE(e.start_s, previous_end) << "event " << i << " overlaps the one before";
      EXPECT_LE(e.start_s, e.end_s) << "event " << i;
      previous_end = e.end_s;
      if (a.kind == ActionKind::kExchange) {
        EXPECT_EQ(e.kind, PipelineEventKind::kExchange);
        int sends = 0;
        for (const Transfer& t : a.transfers) sends += t.send;
        EXPECT_EQ(e.sends, sends);
        EXPECT_EQ(e.receives, static_cast<int>(a.transfers.size()) - sends);
        EXPECT_EQ(e.micro_batch, -1);
      } else {
        EXPECT_EQ(e.kind, a.kind == ActionKind::kForward ? PipelineEventKind::kForward
                                                         : PipelineEventKind::kBackward);
        EXPECT_EQ(e.micro_batch, a.micro_batch);
        EXPECT_EQ(e.chunk, a.chunk);
        EXPECT_EQ(e.sends + e.receives, 0);
      }
    }
  }
}

TEST(PipelineExecutorTest, EventsAsJsonLinesRoundTrip) {
  std::vector<PipelineEvent> events(2);
  events[0] = {PipelineEventKind::kForward, 3, 1, 0, 0, 0.25, 0.5};
  events[1] = {PipelineEventKind::kExchange, -1, -1, 1, 2, 0.5, 0.75};
  const std::string lines = pipeline_events_json_lines(7, 2, events);
  ASSERT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2);
  const std::string first = lines.substr(0, lines.find('\n'));
  const std::string second = lines.substr(first.size() + 1);
  const nlohmann::json f = nlohmann::json::parse(first);
  EXPECT_EQ(f["step"], 7);
  EXPECT_EQ(f["rank"], 2);
  EXPECT_EQ(f["kind"], "forward");
  EXPECT_EQ(f["micro_batch"], 3);
  EXPECT_EQ(f["chunk"], 1);
  EXPECT_EQ(f["start_s"], 0.25);
  EXPECT_EQ(f["end_s"], 0.5);
  const nlohmann::json x = nlohmann::json::parse(second);
  EXPECT_EQ(x["kind"], "exchange");
  EXPECT_EQ(x["sends"], 1);
  EXPECT_EQ(x["receives"], 2);
  EXPECT_EQ(x["micro_batch"], -1);
}

}  // namespace
}  // namespace switchyard
