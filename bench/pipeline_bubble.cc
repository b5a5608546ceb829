// Measures the pipeline bubble of each schedule on CPU ranks against the theory: run under
// mpirun with P ranks, the world being one pipeline (bench/README.md, "pipeline_bubble").
//
// Every stage holds the same work: `--layers` layers of a linear map of `--size` x `--size`
// on activations of `--size` rows (forward one product per layer, backward two: the
// input's and the weight's gradient), or with `--cost sleep` a pause of `--forward-ms`
// per layer forward and twice that backward. An interleaved chunk holds 1/V of the
// stage's layers. For each schedule and micro-batch count it times `--steps` steps after
// one warm-up step, each started by a barrier, and prints per step's median:
//
//   bubble = 1 - busy / step
//
// where `step` is the time from the barrier to the last rank's last action and `busy`
// the largest over ranks of its forward and backward time: the idle share of the busiest
// rank. With equal stages and free messages the schedules' ideal timelines give
// (P-1) / (mV + P-1) (docs/pipeline.md), printed beside it.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "core/runtime/file_util.h"
#include "engine/parallel/mpi_runtime.h"
#include "engine/parallel/pipeline_executor.h"
#include "kernels/threads.h"

namespace switchyard {
namespace {

// The most bytes of activations a rank may hold.
constexpr double kMaxHeldBytes = double{int64_t{4} << 30};

struct Options {
  std::string cost = "matmul";
  int size = 256;
  int layers = 4;
  double forward_ms = 2.0;
  int steps = 5;
  std::vector<int> micro_batches = {1, 2, 4, 8, 16};
  std::string events_dir;
};

// y = x W per layer, row-major, x and y of `size` rows.
void matmul(const float* a, const float* b, float* c, int n, bool transpose_a, bool transpose_b,
            float beta) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, n, n, n, 1.0f, a, n, b, n, beta, c, n);
}

// The chunks of one rank: each a run of equal layers whose cost is fixed by the options.
class FixedCostStages final : public PipelineStages {
 public:
  FixedCostStages(const Options& options, const PipelineShape& shape)
      : options_(options),
        layers_per_chunk_(options.layers / shape.virtual_chunks),
        n_(options.size),
        weight_(static_cast<size_t>(n_) * n_, 1.0f / static_cast<float>(n_)),
        weight_grad_(weight_.size()) {}

  StageMessage forward(int micro_batch, int chunk, const StageMessage& input) override {
    std::vector<Tensor>& saved = saved_[{micro_batch, chunk}];
    Tensor x = input.tensor.defined() ? input.tensor : filled(0.5f);
    for (int l = 0; l < layers_per_chunk_; ++l) {
      saved.push_back(x);
      x = layer_forward(x);
    }
    return x;
  }

  StageMessage backward(int micro_batch, int chunk, const StageMessage& output_grad) override {
    auto it = saved_.find({micro_batch, chunk});
    Tensor dy = output_grad.tensor.defined() ? output_grad.tensor : filled(1.0f);
    for (int l = layers_per_chunk_ - 1; l >= 0; --l) dy = layer_backward(it->second[l], dy);
    saved_.erase(it);
    return dy;
  }

  StageMessage receive_buffer(TransferKind, int, int) override {
    return Tensor::empty({n_, n_}, DType::kF32);
  }

 private:
  Tensor filled(float value) const {
    Tensor t = Tensor::empty({n_, n_}, DType::kF32);
    std::fill(t.data<float>(), t.data<float>() + t.numel(), value);
    return t;
  }

  Tensor layer_forward(const Tensor& x) {
    Tensor y = Tensor::empty({n_, n_}, DType::kF32);
    if (options_.cost == "sleep") {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options_.forward_ms));
      std::copy(x.data<float>(), x.data<float>() + x.numel(), y.data<float>());
    } else {
      matmul(x.data<float>(), weight_.data(), y.data<float>(), n_, false, false, 0.0f);
    }
    return y;
  }

  // dx = dy W^T and dW += x^T dy: twice the forward's work.
  Tensor layer_backward(const Tensor& x, const Tensor& dy) {
    Tensor dx = Tensor::empty({n_, n_}, DType::kF32);
    if (options_.cost == "sleep") {
      std::this_thread::sleep_for(
          std::chrono::duration<double, std::milli>(2 * options_.forward_ms));
      std::copy(dy.data<float>(), dy.data<float>() + dy.numel(), dx.data<float>());
    } else {
      matmul(dy.data<float>(), weight_.data(), dx.data<float>(), n_, false, true, 0.0f);
      matmul(x.data<float>(), dy.data<float>(), weight_grad_.data(), n_, true, false, 1.0f);
    }
    return dx;
  }

  const Options& options_;
  const int layers_per_chunk_;
  const int n_;
  std::vector<float> weight_;
  std::vector<float> weight_grad_;
  std::map<std::pair<int, int>, std::vector<Tensor>> saved_;  // layer inputs per pass
};

double pass_seconds(const std::vector<PipelineEvent>& events) {
  double busy = 0;
  for (const PipelineEvent& e : events)
    if (e.kind != PipelineEventKind::kExchange) busy += e.end_s - e.start_s;
  return busy;
}

struct StepTimes {
  double step_s;  // barrier to the last rank's last action
  double busy_s;  // the busiest rank's forward and backward time
};

// One step on every rank, started together; the times every rank agrees on.
StepTimes timed_step(const Options& options, const PipelineShape& shape, Communicator& world,
                     std::vector<PipelineEvent>& events) {
  FixedCostStages stages(options, shape);
  world.barrier();
  events = run_pipeline_step(shape, world, stages).events;
  // Every rank's (end, busy) in its own slots; the sum gathers them.
  std::vector<double> times(2 * world.size(), 0.0);
  times[2 * world.rank()] = events.back().end_s;
  times[2 * world.rank() + 1] = pass_seconds(events);
  world.all_reduce_sum(times.data(), static_cast<int64_t>(times.size()));
  StepTimes step{0, 0};
  for (int r = 0; r < world.size(); ++r) {
    step.step_s = std::max(step.step_s, times[2 * r]);
    step.busy_s = std::max(step.busy_s, times[2 * r + 1]);
  }
  return step;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Writes the last step's events of `shape` on this rank into the events directory.
void write_events(const Options& options, const PipelineShape& shape, int rank,
                  const std::vector<PipelineEvent>& events) {
  const std::string path =
      options.events_dir + "/" + pipeline_schedule_name(shape.schedule) + "_p" +
      std::to_string(shape.stages) + "_v" + std::to_string(shape.virtual_chunks) + "_m" +
      std::to_string(shape.micro_batches) + ".rank" + std::to_string(rank) + ".jsonl";
  const absl::Status status =
      write_file_atomically(path, pipeline_events_json_lines(options.steps, rank, events));
  if (!status.ok()) {
    std::fprintf(stderr, "pipeline_bubble: %s\n", std::string(status.message()).c_str());
    abort_job(1);
  }
}

void run_shape(const Options& options, const PipelineShape& shape, Communicator& world) {
  std::vector<PipelineEvent> events;
  timed_step(options, shape, world, events);  // warm-up
  std::vector<double> bubbles, steps;
  for (int s = 0; s < options.steps; ++s) {
    const StepTimes t = timed_step(options, shape, world, events);
    bubbles.push_back(t.step_s > 0 ? 1.0 - t.busy_s / t.step_s : 0.0);
    steps.push_back(t.step_s);
  }
  if (!options.events_dir.empty()) write_events(options, shape, world.rank(), events);
  if (world.rank() != 0) return;
  const double b = median(bubbles);
  std::printf("%2d  %-17s %2d %4d %10.1f %8.3f %8.3f %8.2f\n", shape.stages,
              pipeline_schedule_name(shape.schedule).c_str(), shape.virtual_chunks,
              shape.micro_batches, 1e3 * median(steps), b, pipeline_bubble_fraction(shape),
              b / pipeline_bubble_fraction(shape));
  std::fflush(stdout);
}

// Every schedule the world's size and the options allow, interleaved with V = 2.
std::vector<PipelineShape> shapes(const Options& options, int p) {
  std::vector<PipelineShape> out;
  for (int m : options.micro_batches) {
    out.push_back({p, 1, m, PipelineScheduleKind::kGpipe});
    out.push_back({p, 1, m, PipelineScheduleKind::kOneFOneB});
    const PipelineShape interleaved{p, 2, m, PipelineScheduleKind::kInterleaved1F1B};
    if (validate_pipeline_shape(interleaved).ok() && options.layers % 2 == 0)
      out.push_back(interleaved);
  }
  return out;
}

int run(const Options& options) {
  MpiRuntime& runtime = MpiRuntime::get();
  set_cpu_threads(runtime.threads_per_rank());
  std::unique_ptr<Communicator> world = runtime.world_communicator();
  if (world->size() < 2) {
    std::fprintf(stderr,
                 "pipeline_bubble: the pipeline is the job's ranks: run it under mpirun "
                 "with 2 or more\n");
    return 1;
  }
  if (world->rank() == 0) {
    const std::string layer = options.cost == "sleep"
                                  ? absl::StrFormat("%g ms sleep", options.forward_ms)
                                  : std::to_string(options.size) + "^3 matmul";
    std::printf(
        "%d layers per stage, a layer's forward %s (backward twice that), %d threads "
        "per rank, median of %d steps\n",
        options.layers, layer.c_str(), runtime.threads_per_rank(), options.steps);
    std::printf(" P  schedule          V    m    step_ms   bubble   theory  measured/theory\n");
  }
  for (const PipelineShape& shape : shapes(options, world->size()))
    run_shape(options, shape, *world);
  return 0;
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  switchyard::use_fastest_blas_kernels(argv);
  switchyard::MpiRuntime::initialize(&argc, &argv);
  switchyard::Options options;
  CLI::App app("Pipeline bubble of each schedule against the theory, on this job's ranks");
  app.add_option("--cost", options.cost, "matmul or sleep")
      ->check(CLI::IsMember({"matmul", "sleep"}));
  app.add_option("--size", options.size, "rows and width of a layer's matmul")
      ->check(CLI::Range(1, 4096));
  app.add_option("--layers", options.layers, "layers per stage (even for interleaved)")
      ->check(CLI::Range(1, 64));
  app.add_option("--forward-ms", options.forward_ms, "a layer's forward with --cost sleep")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--steps", options.steps, "timed steps per shape")->check(CLI::Range(1, 100));
  app.add_option("--micro-batches", options.micro_batches, "micro-batch counts")
      ->check(CLI::Range(1, 256));
  app.add_option("--events", options.events_dir,
                 "existing directory for each shape's last step's events (JSON lines)")
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
  if (!std::isfinite(options.forward_ms)) {
    std::fprintf(stderr, "pipeline_bubble: --forward-ms must be a number of milliseconds\n");
    return 1;
  }
  // GPipe holds every micro-batch's layer inputs at once.
  const int most = *std::max_element(options.micro_batches.begin(), options.micro_batches.end());
  const double held = 4.0 * most * options.layers * options.size * options.size;
  if (held > switchyard::kMaxHeldBytes) {
    std::fprintf(stderr,
                 "pipeline_bubble: --micro-batches (most %d) x --layers (%d) x --size^2 (%d^2) "
                 "activations take %.1f GiB; at most %.0f GiB\n",
                 most, options.layers, options.size, held / (1 << 30),
                 switchyard::kMaxHeldBytes / (1 << 30));
    return 1;
  }
  return switchyard::run(options);
}
