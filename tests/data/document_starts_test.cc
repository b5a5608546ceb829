// Each window position's document start (TokenDataset::window_document_starts), read from
// the shards' /doc_offsets across shard boundaries, and handed out by the loader beside
// the ids for document-aware attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/runtime/check.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace switchyard {
namespace {

using testing::ScratchDir;
using testing::write_position_dataset;

constexpr int64_t kSeq = 16;

// The train split of write_position_dataset(dir, {120, 75}, ...): documents of 50 tokens
// per shard, so they start at 0, 50, 100 (a 20-token tail), 120 (the second shard), 170.
const std::vector<int64_t> kDocumentStarts = {0, 50, 100, 120, 170};

// Position i of window w: the last document start at or before its stream position,
// relative to the window (0 when before it).
int32_t expected_start(int64_t window, int64_t i) {
  const int64_t t = window * kSeq + i;
  const int64_t start = *(std::upper_bound(kDocumentStarts.begin(), kDocumentStarts.end(), t) - 1);
  return static_cast<int32_t>(std::max<int64_t>(0, start - window * kSeq));
}

TokenDataset open_with_documents(const std::string& dir) {
  DatasetOpenOptions options;
  options.with_documents = true;
  auto data = TokenDataset::open(dir, "train", options);
  SY_CHECK(data.ok());
  return *data;
}

TEST(DocumentStartsTest, WindowsRestartAtEveryDocumentAcrossShards) {
  ScratchDir dir;
  write_position_dataset(dir / "d", {120, 75}, {60});
  const TokenDataset data = open_with_documents(dir / "d");
  ASSERT_TRUE(data.has_documents());
  ASSERT_EQ(data.num_windows(kSeq), 12);
  int restarts = 0;
  for (int64_t w = 0; w < data.num_windows(kSeq); ++w) {
    std::vector<int32_t> starts(kSeq, -1);
    data.window_document_starts(w, kSeq, starts.data());
    for (int64_t i = 0; i < kSeq; ++i) {
      EXPECT_EQ(starts[i], expected_start(w, i)) << "window " << w << " position " << i;
      restarts += i > 0 && starts[i] == i;
    }
  }
  // 50, 100, 120 and 170 fall inside windows (not at a window's first position).
  EXPECT_EQ(restarts, 4);
}

TEST(DocumentStartsTest, LoaderHandsOutEachWindowsStarts) {
  ScratchDir dir;
  write_position_dataset(dir / "d", {120, 75}, {60});
  const TokenDataset data = open_with_documents(dir / "d");
  LoaderOptions options;
  options.seq_len = kSeq;
  options.seed = 9;
  options.global_batch = 4;
  options.document_starts = true;
  auto loader = Loader::create(data, options);
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<int32_t> ids(2 * kSeq), targets(2 * kSeq), starts(2 * kSeq);
  for (int call = 0; call < 10; ++call) {
    ASSERT_TRUE((*loader)->next_batch(2, ids.data(), targets.data(), starts.data()).ok());
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t window = ids[b * kSeq] / kSeq;  // token t has id t
      for (int64_t i = 0; i < kSeq; ++i)
        EXPECT_EQ(starts[b * kSeq + i], expected_start(window, i)) << "window " << window;
    }
  }
}

TEST(DocumentStartsTest, LoaderRefusesADatasetOpenedWithoutDocuments) {
  ScratchDir dir;
  write_position_dataset(dir / "d", {120}, {60});
  auto data = TokenDataset::open(dir / "d", "train");
  ASSERT_TRUE(data.ok());
  EXPECT_FALSE(data->has_documents());
  LoaderOptions options;
  options.seq_len = kSeq;
  options.global_batch = 1;
  options.document_starts = true;
  auto loader = Loader::create(*data, options);
  ASSERT_FALSE(loader.ok());
  EXPECT_TRUE(testing::IsOneLineWith(std::string(loader.status().message()),
                                     "opened without its documents"));
}

}  // namespace
}  // namespace switchyard
