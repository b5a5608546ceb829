// End-to-end training on the bundled corpus: the tiny recipe learns, and the same seed
// gives the same losses bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/recipe.h"
#include "engine/train/trainer.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();

class CollectingSink : public ProgressSink {
 public:
  void on_step(const StepMetrics& m) override { steps.push_back(m); }
  void on_eval(int64_t step, double val_loss) override { evals.emplace_back(step, val_loss); }
  void on_message(const std::string&) override {}
  std::vector<StepMetrics> steps;
  std::vector<std::pair<int64_t, double>> evals;
};

config::Recipe tiny(const std::vector<std::string>& overrides) {
  auto recipe = config::load_recipe((kRoot / "recipes/tiny.textproto").string(), overrides);
  EXPECT_TRUE(recipe.ok()) << recipe.status();
  return *recipe;
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("switchyard-test-" + name + "-" +
                                              std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// One prepared copy of the bundled corpus for every run of this test binary, removed
// when the binary ends.
const fs::path kDatasetCache = temp_dir("datasets");
class RemoveDatasetCache : public ::testing::Environment {
  void TearDown() override { fs::remove_all(kDatasetCache); }
};
const auto* const kCacheCleanup = ::testing::AddGlobalTestEnvironment(new RemoveDatasetCache);

TrainOptions options(const fs::path& run_dir, double peak_flops) {
  TrainOptions o;
  o.run_dir = run_dir.string();
  o.peak.flops = peak_flops;
  o.dataset_cache_dir = kDatasetCache.string();
  return o;
}

TEST(Training, TinyRecipeLearns) {
  // A shortened schedule of the tiny recipe: validation loss must fall far below the
  // untrained model's (about ln 1024 = 6.9 nats per token).
  const config::Recipe recipe = tiny({"train.steps=60", "optimizer.warmup_steps=10",
                                      "train.eval_interval=60", "train.eval_batches=4"});
  CollectingSink sink;
  const fs::path dir = temp_dir("learns");
  const absl::Status status = train(recipe, options(dir, 180e9), sink).status();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(sink.evals.size(), 2u);
  const double start = sink.evals.front().second, end = sink.evals.back().second;
  EXPECT_GT(start, 6.5);
  EXPECT_LT(end, start - 1.5);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints/final/model.safetensors"));
  std::ifstream metrics(fs::path(dir) / "metrics.jsonl");
  int lines = 0, memory_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    ++lines;
    if (line.find("\"memory_bytes\"") != std::string::npos) ++memory_lines;
  }
  // A line per log interval of 10 steps, two evals and the memory report.
  EXPECT_EQ(lines, 6 + 2 + 1);
  EXPECT_EQ(memory_lines, 1);
  // TensorBoard events beside metrics.jsonl (their format is tested on its own).
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0 &&
        fs::file_size(entry.path()) > 1000)
      ++event_files;
  EXPECT_EQ(event_files, 1);
  fs::remove_all(dir);
}

TEST(Training, SameSeedSameLossesBitForBit) {
  const std::vector<std::string> overrides = {"train.steps=3", "optimizer.warmup_steps=1",
                                              "train.log_interval=1",
                                              "train.eval_interval=0", "moe.gating=GSHARD_TOP2",
                                              "moe.capacity_factor=1.25"};
  std::vector<double> losses[2];
  for (int run = 0; run < 2; ++run) {
    CollectingSink sink;
    const fs::path dir = temp_dir("seed" + std::to_string(run));
    const absl::Status status = train(tiny(overrides), options(dir, 0), sink).status();
    ASSERT_TRUE(status.ok()) << status;
    for (const StepMetrics& m : sink.steps) {
      losses[run].push_back(m.loss);
      losses[run].push_back(m.grad_norm);
    }
    fs::remove_all(dir);
  }
  ASSERT_EQ(losses[0].size(), 6u);
  EXPECT_EQ(losses[0], losses[1]);
}

}  // namespace
}  // namespace switchyard
