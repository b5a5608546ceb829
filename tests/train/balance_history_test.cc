// Each layer's imbalance over a run, read back from metrics.jsonl: the lines that have it,
// and one error naming the line for every malformed one.
#include "engine/train/balance_history.h"

#include <gtest/gtest.h>

#include <string>

#include "core/runtime/rng.h"

namespace switchyard {
namespace {

TEST(BalanceHistoryTest, ReadsTheLinesThatListTheLayers) {
  const std::string text =
      "{\"step\":0,\"val_loss\":6.9}\n"
      "{\"step\":10,\"loss\":6.1,\"layer_imbalance\":[3.5,1.25]}\n"
      "{\"step\":20,\"loss\":5.2,\"layer_imbalance\":[2,1.5]}\n"
      "{\"step\":20,\"val_loss\":5.0}\n"
      "{\"step\":30,\"loss\":4.9,\"layer_imb";  // torn by a kill
  const auto h = read_imbalance_history(text, "metrics.jsonl");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->steps, (std::vector<int64_t>{10, 20}));
  ASSERT_EQ(h->layers.size(), 2u);
  EXPECT_EQ(h->layers[0], (std::vector<double>{3.5, 2.0}));
  EXPECT_EQ(h->layers[1], (std::vector<double>{1.25, 1.5}));
}

TEST(BalanceHistoryTest, ARunWithoutTheFieldHasNoHistory) {
  const auto h = read_imbalance_history("{\"step\":1,\"loss\":2}\n", "metrics.jsonl");
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->steps.empty() && h->layers.empty());
}

void expect_refused(const std::string& text, const std::string& why) {
  const auto h = read_imbalance_history(text, "run/metrics.jsonl");
  ASSERT_FALSE(h.ok()) << text;
  EXPECT_NE(std::string(h.status().message()).find("run/metrics.jsonl"), std::string::npos);
  EXPECT_NE(std::string(h.status().message()).find(why), std::string::npos) << h.status();
}

TEST(BalanceHistoryTest, RefusesMalformedLinesNamingThem) {
  expect_refused("{\"step\":1,\"layer_imbalance\":[1]}\n[1]\n", "line 2 is not a JSON object");
  expect_refused("{\"step\":1,\"layer_imbalance\":\"2\"}\n", "line 1 field layer_imbalance");
  expect_refused("{\"step\":1,\"layer_imbalance\":[]}\n", "layer_imbalance must be an array");
  expect_refused("{\"step\":1,\"layer_imbalance\":[-1]}\n", "finite numbers >= 0");
  expect_refused("{\"step\":1,\"layer_imbalance\":[1e999]}\n", "line 1");
  expect_refused("{\"step\":1,\"layer_imbalance\":[1,[2]]}\n", "finite numbers >= 0");
  expect_refused("{\"layer_imbalance\":[1]}\n", "no integer step");
  expect_refused("{\"step\":1,\"layer_imbalance\":[1,2]}\n{\"step\":2,\"layer_imbalance\":[1]}\n",
                 "line 2 lists 1 layers");
  std::string many = "{\"step\":1,\"layer_imbalance\":[1";
  for (int i = 0; i < kMaxHistoryLayers; ++i) many += ",1";
  expect_refused(many + "]}\n", "1 to 4096");
  expect_refused("{\"step\":1,\"x\":[[[[[[1]]]]]],\"layer_imbalance\":[1]}\n", "line 1");
}

// The fuzz target's promise (tests/fuzz/imbalance_history_fuzz.cc) on mutations of its
// seed: every input is read or refused in one line naming the file.
TEST(BalanceHistoryTest, MutatedFilesAreReadOrRefusedInOneLine) {
  const std::string seed =
      "{\"step\":0,\"val_loss\":6.9}\n"
      "{\"step\":1,\"loss\":6.9,\"layer_imbalance\":[2.5,1.25]}\n"
      "{\"step\":2,\"loss\":6.8,\"layer_imbalance\":[2.0,1.5]}\n";
  const char bytes[] = "{}[],:\"0123456789.-eE \n\x01\xff";
  Rng rng(5);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = seed;
    const int edits = 1 + static_cast<int>(rng.uniform() * 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = static_cast<size_t>(rng.uniform() * static_cast<double>(text.size()));
      const char c = bytes[static_cast<size_t>(rng.uniform() * (sizeof(bytes) - 1))];
      if (rng.uniform() < 0.5)
        text[at] = c;
      else
        text.insert(at, 1, c);
    }
    const auto h = read_imbalance_history(text, "metrics.jsonl");
    if (h.ok()) {
      for (const std::vector<double>& layer : h->layers) EXPECT_EQ(layer.size(), h->steps.size());
      continue;
    }
    const std::string message(h.status().message());
    EXPECT_NE(message.find("metrics.jsonl"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace switchyard
