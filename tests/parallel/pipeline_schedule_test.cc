// Pipeline schedules (engine/parallel/pipeline_schedule.h) run by a simulator: every
// rank's action list executes against blocking (rendezvous) point-to-point semantics,
// where a message moves only while both its sender and its receiver have posted it and
// an exchange ends once all its messages have moved. Forward and backward passes take
// one time unit. The simulator asserts that no rank waits forever, that each pass finds
// its input, that messages between two ranks match in the order both sides post them,
// and measures the bubble and the micro-batches in flight on the first stage.
#include "engine/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using ::testing::HasSubstr;
using Kind = PipelineScheduleKind;

struct SimResult {
  bool deadlock = false;
  double bubble = 0;              // idle time / makespan, the same on every rank
  int first_stage_in_flight = 0;  // most forwards without their backward on rank 0
};

// (kind, micro-batch, model chunk the data enters): what a message is about.
using Payload = std::tuple<TransferKind, int, int>;

class Simulator {
 public:
  // Passes take `forward_time` and `backward_time`.
  explicit Simulator(const PipelineShape& shape, double forward_time = 1, double backward_time = 1)
      : shape_(shape), forward_time_(forward_time), backward_time_(backward_time) {
    for (int r = 0; r < shape.stages; ++r) add_rank(pipeline_actions(shape, r));
  }
  // Given lists instead of the schedule's, one per pipeline rank.
  Simulator(const PipelineShape& shape, const std::vector<std::vector<PipelineAction>>& lists)
      : shape_(shape) {
    for (const auto& actions : lists) add_rank(actions);
  }

  SimResult run() {
    SimResult result;
    int first_in_flight = 0;
    while (true) {
      bool progress = false;
      bool finished = true;
      for (int r = 0; r < shape_.stages; ++r) {
        Rank& rank = ranks_[r];
        if (rank.pc >= rank.actions.size()) continue;
        finished = false;
        const PipelineAction& action = rank.actions[rank.pc];
        if (action.kind == ActionKind::kExchange) {
          progress |= try_exchange(r);
          continue;
        }
        run_pass(r, action);
        if (r == 0) {
          first_in_flight += action.kind == ActionKind::kForward ? 1 : -1;
          result.first_stage_in_flight = std::max(result.first_stage_in_flight, first_in_flight);
        }
        progress = true;
      }
      if (finished) break;
      if (!progress) {
        result.deadlock = true;
        return result;
      }
    }
    double makespan = 0;
    for (const Rank& rank : ranks_) makespan = std::max(makespan, rank.clock);
    const double busy =
        (forward_time_ + backward_time_) * shape_.micro_batches * shape_.virtual_chunks;
    result.bubble = (makespan - busy) / makespan;
    check_all_delivered();
    return result;
  }

 private:
  struct Rank {
    std::vector<PipelineAction> actions;
    size_t pc = 0;
    double clock = 0;
    std::vector<bool> moved;                  // per transfer of the current exchange
    double exchange_end = 0;                  // latest move of the current exchange
    std::set<Payload> inbox;                  // received, not yet consumed
    std::set<std::pair<int, int>> forwarded;  // (micro-batch, chunk) whose forward ran
    std::set<std::pair<int, int>> backwarded;
    // Messages posted so far per (peer, send?): their order in that stream. Kinds share
    // a stream, as the messages of a device communicator (no tags) do.
    std::map<std::pair<int, bool>, int> posted;
    std::vector<int> order;  // each current transfer's position in its stream
  };

  void add_rank(const std::vector<PipelineAction>& actions) {
    ranks_.emplace_back();
    ranks_.back().actions = actions;
  }

  // The model chunk a transfer's data enters (receive side) or would enter (send side).
  int destination_chunk(int rank, const Transfer& t) const {
    const int k = shape_.model_chunk(rank, t.chunk);
    if (!t.send) return k;
    return t.kind == TransferKind::kActivation ? k + 1 : k - 1;
  }

  void run_pass(int r, const PipelineAction& action) {
    Rank& rank = ranks_[r];
    const int k = shape_.model_chunk(r, action.chunk);
    const std::pair<int, int> pass{action.micro_batch, action.chunk};
    if (action.kind == ActionKind::kForward) {
      EXPECT_TRUE(rank.forwarded.insert(pass).second) << "forward twice on rank " << r;
      if (k > 0) consume(rank, {TransferKind::kActivation, action.micro_batch, k}, r);
    } else {
      EXPECT_TRUE(rank.forwarded.count(pass)) << "backward before forward on rank " << r;
      EXPECT_TRUE(rank.backwarded.insert(pass).second) << "backward twice on rank " << r;
      if (k + 1 < shape_.num_chunks())
        consume(rank, {TransferKind::kGradient, action.micro_batch, k}, r);
    }
    rank.clock += action.kind == ActionKind::kForward ? forward_time_ : backward_time_;
    ++rank.pc;
  }

  void consume(Rank& rank, const Payload& payload, int r) {
    EXPECT_EQ(rank.inbox.erase(payload), 1u)
        << "rank " << r << " runs micro-batch " << std::get<1>(payload) << " on model chunk "
        << std::get<2>(payload) << " before receiving its input";
  }

  // Posts the current exchange (once) and moves every message whose other side is posted
  // too; returns whether anything happened.
  bool try_exchange(int r) {
    Rank& rank = ranks_[r];
    const PipelineAction& action = rank.actions[rank.pc];
    bool progress = false;
    if (rank.moved.empty()) post(rank, action);
    for (size_t i = 0; i < action.transfers.size(); ++i) {
      if (rank.moved[i]) continue;
      const Transfer& t = action.transfers[i];
      Rank& peer = ranks_[t.peer];
      if (peer.pc >= peer.actions.size()) continue;
      const PipelineAction& other = peer.actions[peer.pc];
      if (other.kind != ActionKind::kExchange || peer.moved.empty()) continue;
      for (size_t j = 0; j < other.transfers.size(); ++j) {
        const Transfer& u = other.transfers[j];
        if (peer.moved[j] || u.peer != r || u.send == t.send || peer.order[j] != rank.order[i])
          continue;
        const Transfer& send = t.send ? t : u;
        const int sender = t.send ? r : t.peer;
        const Transfer& recv = t.send ? u : t;
        const int receiver = t.send ? t.peer : r;
        EXPECT_EQ(send.kind, recv.kind) << "messages matched out of order";
        EXPECT_EQ(send.micro_batch, recv.micro_batch) << "messages matched out of order";
        EXPECT_EQ(destination_chunk(sender, send), destination_chunk(receiver, recv))
            << "messages matched out of order";
        ranks_[receiver].inbox.insert(
            {recv.kind, recv.micro_batch, destination_chunk(receiver, recv)});
        const double at = std::max(rank.clock, peer.clock);
        rank.moved[i] = peer.moved[j] = true;
        rank.exchange_end = std::max(rank.exchange_end, at);
        peer.exchange_end = std::max(peer.exchange_end, at);
        progress = true;
        break;
      }
    }
    return finish_exchange(rank) || progress;
  }

  void post(Rank& rank, const PipelineAction& action) {
    rank.moved.assign(action.transfers.size(), false);
    rank.order.clear();
    for (const Transfer& t : action.transfers)
      rank.order.push_back(rank.posted[{t.peer, t.send}]++);
    rank.exchange_end = rank.clock;
  }

  // Ends the exchange once all its messages have moved; returns whether it did.
  bool finish_exchange(Rank& rank) {
    if (std::count(rank.moved.begin(), rank.moved.end(), false) > 0) return false;
    rank.clock = rank.exchange_end;
    rank.moved.clear();
    ++rank.pc;
    return true;
  }

  void check_all_delivered() {
    for (int r = 0; r < shape_.stages; ++r) {
      const Rank& rank = ranks_[r];
      EXPECT_TRUE(rank.inbox.empty()) << "rank " << r << " received data it never used";
      EXPECT_EQ(rank.forwarded.size(),
                static_cast<size_t>(shape_.micro_batches) * shape_.virtual_chunks);
      EXPECT_EQ(rank.backwarded.size(), rank.forwarded.size());
    }
  }

  PipelineShape shape_;
  double forward_time_ = 1;
  double backward_time_ = 1;
  std::vector<Rank> ranks_;
};

PipelineShape shape_of(int p, int v, int m, Kind kind) {
  return PipelineShape{.stages = p, .virtual_chunks = v, .micro_batches = m, .schedule = kind};
}

std::string describe(const PipelineShape& s) {
  return pipeline_schedule_name(s.schedule) + " P=" + std::to_string(s.stages) +
         " V=" + std::to_string(s.virtual_chunks) + " m=" + std::to_string(s.micro_batches);
}

SimResult simulate(const PipelineShape& shape) {
  EXPECT_TRUE(validate_pipeline_shape(shape).ok()) << validate_pipeline_shape(shape);
  return Simulator(shape).run();
}

TEST(PipelineScheduleTest, OneFOneBHoldsAtMostPMicroBatchesAndMeetsTheBubble) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      const PipelineShape shape = shape_of(p, 1, m, Kind::kOneFOneB);
      SCOPED_TRACE(describe(shape));
      const SimResult result = simulate(shape);
      ASSERT_FALSE(result.deadlock);
      EXPECT_EQ(result.first_stage_in_flight, std::min(p, m));
      EXPECT_NEAR(result.bubble, pipeline_bubble_fraction(shape), 1e-12);
    }
}

TEST(PipelineScheduleTest, GpipeHoldsEveryMicroBatchAndMeetsTheBubble) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 4, 8}) {
      const PipelineShape shape = shape_of(p, 1, m, Kind::kGpipe);
      SCOPED_TRACE(describe(shape));
      const SimResult result = simulate(shape);
      ASSERT_FALSE(result.deadlock);
      EXPECT_EQ(result.first_stage_in_flight, m);
      EXPECT_NEAR(result.bubble, pipeline_bubble_fraction(shape), 1e-12);
    }
}

// A backward twice as long as a forward (a GEMM's two products against one) changes
// none of them: the fill and drain are P - 1 forwards and backwards either way (chunk
// passes, interleaved).
TEST(PipelineScheduleTest, BubbleHoldsWhenBackwardTakesTwiceTheForward) {
  std::vector<PipelineShape> shapes;
  for (Kind kind : {Kind::kGpipe, Kind::kOneFOneB})
    for (int p : {2, 4})
      for (int m : {1, 4, 8}) shapes.push_back(shape_of(p, 1, m, kind));
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int groups : {1, 2})
        shapes.push_back(shape_of(p, v, p * groups, Kind::kInterleaved1F1B));
  for (const PipelineShape& shape : shapes) {
    SCOPED_TRACE(describe(shape));
    const SimResult result = Simulator(shape, 1, 2).run();
    ASSERT_FALSE(result.deadlock);
    EXPECT_NEAR(result.bubble, pipeline_bubble_fraction(shape), 1e-12);
  }
}

TEST(PipelineScheduleTest, InterleavedDividesTheBubbleByV) {
  for (int p : {2, 3, 4})
    for (int v : {2, 3, 4})
      for (int groups : {1, 2, 3}) {
        const PipelineShape shape = shape_of(p, v, p * groups, Kind::kInterleaved1F1B);
        SCOPED_TRACE(describe(shape));
        const SimResult result = simulate(shape);
        ASSERT_FALSE(result.deadlock);
        EXPECT_NEAR(result.bubble, pipeline_bubble_fraction(shape), 1e-12);
      }
}

// The activations each rank holds at its peak, the quantity a memory plan scales: GPipe
// all m micro-batches, 1F1B at most P - r on rank r, interleaved its warm-up plus one
// chunk passes (so rank 0 holds more of its layers' activations than under 1F1B).
TEST(PipelineScheduleTest, PeakChunkPassesPerRank) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 8, 16})
      for (int r = 0; r < p; ++r) {
        SCOPED_TRACE(describe(shape_of(p, 1, m, Kind::kGpipe)) + " rank " + std::to_string(r));
        EXPECT_EQ(pipeline_peak_chunk_passes(shape_of(p, 1, m, Kind::kGpipe), r), m);
        EXPECT_EQ(pipeline_peak_chunk_passes(shape_of(p, 1, m, Kind::kOneFOneB), r),
                  std::min(m, p - r));
      }
  for (int p : {2, 3, 4})
    for (int v : {2, 3, 4})
      for (int groups : {1, 2, 3})
        for (int r = 0; r < p; ++r) {
          const PipelineShape shape = shape_of(p, v, p * groups, Kind::kInterleaved1F1B);
          SCOPED_TRACE(describe(shape) + " rank " + std::to_string(r));
          EXPECT_EQ(pipeline_peak_chunk_passes(shape, r),
                    std::min(p * groups * v, 2 * (p - r - 1) + (v - 1) * p + 1));
        }
}

// Two stages that each send before receiving, in separate exchanges, wait for each
// other forever under rendezvous semantics: the simulator must say so.
TEST(PipelineScheduleTest, SimulatorDetectsDeadlock) {
  auto exchange = [](bool send, TransferKind kind, int peer) {
    PipelineAction action;
    action.kind = ActionKind::kExchange;
    action.transfers.push_back({send, kind, 0, 0, peer});
    return action;
  };
  const std::vector<std::vector<PipelineAction>> lists = {
      {exchange(true, TransferKind::kActivation, 1), exchange(false, TransferKind::kGradient, 1)},
      {exchange(true, TransferKind::kGradient, 0), exchange(false, TransferKind::kActivation, 0)}};
  EXPECT_TRUE(Simulator(shape_of(2, 1, 1, Kind::kOneFOneB), lists).run().deadlock);
}

TEST(PipelineScheduleTest, ActionsOfOneStageAreTheUnpipelinedLoop) {
  const std::vector<PipelineAction> actions =
      pipeline_actions(shape_of(1, 1, 3, Kind::kOneFOneB), 0);
  ASSERT_EQ(actions.size(), 6u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(actions[2 * i].kind, ActionKind::kForward);
    EXPECT_EQ(actions[2 * i].micro_batch, i);
    EXPECT_EQ(actions[2 * i + 1].kind, ActionKind::kBackward);
    EXPECT_EQ(actions[2 * i + 1].micro_batch, i);
  }
}

TEST(PipelineScheduleTest, RefusesInvalidShapesInOneLine) {
  auto error = [](const PipelineShape& shape) {
    const absl::Status status = validate_pipeline_shape(shape);
    EXPECT_FALSE(status.ok()) << describe(shape);
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
    return std::string(status.message());
  };
  EXPECT_THAT(error(shape_of(0, 1, 4, Kind::kOneFOneB)),
              HasSubstr("parallel.pipeline_parallel_size (0) must be >= 1"));
  EXPECT_THAT(error(shape_of(2, 0, 4, Kind::kOneFOneB)),
              HasSubstr("parallel.virtual_pipeline_size (0) must be >= 1"));
  EXPECT_THAT(error(shape_of(2, 1, 0, Kind::kGpipe)), HasSubstr("micro-batches per step (0)"));
  EXPECT_THAT(error(shape_of(2, 2, 4, Kind::kOneFOneB)),
              HasSubstr("parallel.virtual_pipeline_size (2) must be 1"));
  EXPECT_THAT(error(shape_of(2, 1, 4, Kind::kInterleaved1F1B)), HasSubstr("both >= 2"));
  EXPECT_THAT(error(shape_of(1, 2, 4, Kind::kInterleaved1F1B)), HasSubstr("both >= 2"));
  EXPECT_THAT(error(shape_of(4, 2, 6, Kind::kInterleaved1F1B)),
              HasSubstr("micro-batches per step (6) to be a multiple of "
                        "parallel.pipeline_parallel_size (4)"));
  EXPECT_THAT(error(shape_of(2, 1 << 11, 1 << 10, Kind::kInterleaved1F1B)), HasSubstr("<= "));
}

}  // namespace
}  // namespace switchyard
