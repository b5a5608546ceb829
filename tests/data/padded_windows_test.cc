// Padding instead of packing (DatasetOpenOptions::pad_documents): window w is document w,
// cut to seq_len + 1 tokens, then padded with no target.
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

// write_position_dataset(dir, {120, 75}, ...): token t has id t; documents of 50 tokens
// per shard: [0, 50), [50, 100), [100, 120), [120, 170), [170, 195).
const std::vector<std::pair<int64_t, int64_t>> kDocuments = {
    {0, 50}, {50, 100}, {100, 120}, {120, 170}, {170, 195}};

TokenDataset open_padded(const std::string& dir) {
  DatasetOpenOptions options;
  options.pad_documents = true;
  auto data = TokenDataset::open(dir, "train", options);
  SY_CHECK(data.ok());
  return *data;
}

TEST(PaddedWindowsTest, EachWindowIsOneDocumentPaddedOrCut) {
  ScratchDir dir;
  write_position_dataset(dir / "d", {120, 75}, {60});
  const TokenDataset data = open_padded(dir / "d");
  EXPECT_EQ(data.pad_id(), 0);  // no pad or eos in the position dataset
  for (const int64_t seq : {64, 16}) {
    ASSERT_EQ(data.num_windows(seq), 5);
    for (int64_t w = 0; w < 5; ++w) {
      std::vector<int32_t> ids(seq), targets(seq);
      ASSERT_TRUE(data.read_window(w, seq, ids.data(), targets.data()).ok());
      const auto [first, end] = kDocuments[w];
      const int64_t count = std::min(end - first, seq + 1);
      for (int64_t i = 0; i < seq; ++i) {
        SCOPED_TRACE(::testing::Message() << "seq " << seq << " window " << w << " position " << i);
        EXPECT_EQ(ids[i], i < count ? first + i : data.pad_id());
        EXPECT_EQ(targets[i], i + 1 < count ? first + i + 1 : kIgnoredTarget);
      }
      // The positions holding text: the MoE router's real tokens.
      EXPECT_EQ(data.window_tokens(w, seq), std::min(count, seq));
    }
  }
}

TEST(PaddedWindowsTest, TheLoaderDrawsEveryDocumentOncePerEpoch) {
  ScratchDir dir;
  write_position_dataset(dir / "d", {120, 75}, {60});
  const TokenDataset data = open_padded(dir / "d");
  LoaderOptions options;
  options.seq_len = 64;
  options.seed = 3;
  options.global_batch = 5;
  auto loader = Loader::create(data, options);
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<int32_t> ids(5 * 64), targets(5 * 64), tokens(5);
  ASSERT_TRUE((*loader)->next_batch(5, ids.data(), targets.data(), nullptr, tokens.data()).ok());
  std::vector<int32_t> firsts;
  for (int64_t b = 0; b < 5; ++b) {
    firsts.push_back(ids[b * 64]);
    // Each window's text tokens come with it: its document's length, at most 64.
    const auto document = std::find_if(kDocuments.begin(), kDocuments.end(),
                                       [&](const auto& d) { return d.first == ids[b * 64]; });
    ASSERT_NE(document, kDocuments.end());
    EXPECT_EQ(tokens[b], std::min<int64_t>(document->second - document->first, 64));
  }
  std::sort(firsts.begin(), firsts.end());
  EXPECT_EQ(firsts, (std::vector<int32_t>{0, 50, 100, 120, 170}));
}

}  // namespace
}  // namespace switchyard
