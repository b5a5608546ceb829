// The training progress sink fed steps with "is a terminal" on and off: plain lines for
// logs; on a terminal one line redrawn in place, read back through a small model of
// what a terminal shows for "\r", "\x1b[K" and "\n".
#include "engine/cli/progress_line.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace switchyard {
namespace {

// Everything the sink writes, with the sink destroyed before the text is read.
std::string capture(bool live, int width, const std::function<void(TrainProgressSink&)>& feed) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  {
    TrainProgressSink sink(out, live, width);
    feed(sink);
  }
  std::fclose(out);
  std::string text(buffer, size);
  std::free(buffer);
  return text;
}

// The lines a terminal would show: "\r" returns to column 0, "\x1b[K" erases to the end
// of the line, "\n" starts a new line; other bytes overwrite the cell under the cursor.
std::vector<std::string> screen(const std::string& text) {
  std::vector<std::string> lines(1);
  size_t column = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    std::string& line = lines.back();
    if (text[i] == '\r') {
      column = 0;
    } else if (text[i] == '\n') {
      lines.emplace_back();
      column = 0;
    } else if (text.compare(i, 3, "\x1b[K") == 0) {
      line.resize(std::min(line.size(), column));
      i += 2;
    } else {
      if (column < line.size())
        line[column] = text[i];
      else
        line.push_back(text[i]);
      ++column;
    }
  }
  return lines;
}

StepMetrics step(int64_t n, int64_t total) {
  StepMetrics m;
  m.step = n;
  m.total_steps = total;
  m.loss = 3.5;
  m.aux_loss = 2.0;
  m.z_loss = 1.25;
  m.lr = 3e-4;
  m.grad_norm = 0.75;
  m.tokens_per_s = 13659;
  m.mfu = 0.569;
  m.worst_load_ratio = 3.84;
  m.elapsed_s = n;
  m.eta_s = static_cast<double>(total - n);
  return m;
}

TEST(FormatDuration, Units) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(90), "1m30s");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::nan("")), "?");
}

TEST(TrainProgressSink, PlainLinesWhenNotATerminal) {
  const std::string text = capture(false, 80, [](TrainProgressSink& sink) {
    sink.on_message("switchyard train: tiny");
    sink.on_step(step(10, 30));
    sink.on_step(step(20, 30));
    sink.on_eval(20, 3.0689);
    sink.on_step(step(30, 30));
    sink.on_message("saved final weights to run/checkpoints/final");
  });
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  const std::vector<std::string> lines = screen(text);
  ASSERT_EQ(lines.size(), 7u) << text;  // six lines and the empty one after the last "\n"
  EXPECT_EQ(lines[0], "switchyard train: tiny");
  EXPECT_EQ(lines[1],
            "step    10/30  loss 3.5000  aux 2.0000  z 1.2500  lr 3.00e-04  grad 0.750  "
            "13659 tok/s  mfu 56.9%  dropped 0.00%  load max/mean 3.84  eta 20s");
  EXPECT_EQ(lines[2].substr(0, 13), "step    20/30");
  EXPECT_EQ(lines[3], "eval step 20  val_loss 3.0689");
  EXPECT_EQ(lines[4].substr(0, 13), "step    30/30");
  EXPECT_NE(lines[4].find("eta 0s"), std::string::npos);
  EXPECT_EQ(lines[5], "saved final weights to run/checkpoints/final");
  EXPECT_EQ(lines[6], "");
}

TEST(FormatCount, Units) {
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(4.56e6), "4.56M");
  EXPECT_EQ(format_count(7.891e9), "7.89G");
  EXPECT_EQ(format_count(-1), "?");
}

TEST(TrainProgressSink, ABlendShowsTokensAndValidationLossPerSource) {
  const std::string text = capture(false, 0, [](TrainProgressSink& sink) {
    StepMetrics m = step(10, 30);
    m.tokens_by_source = {{"plays", 4915}, {"chat", 1229}};
    sink.on_step(m);
    sink.on_eval(10, 3.25);
    sink.on_source_evals(10, {{"plays", 3.0}, {"chat", 4.0}});
  });
  const std::vector<std::string> lines = screen(text);
  ASSERT_EQ(lines.size(), 4u) << text;
  EXPECT_NE(lines[0].find("eta 20s  tokens plays 4.9k chat 1.2k"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1], "eval step 10  val_loss 3.2500");
  EXPECT_EQ(lines[2], "eval step 10  val_loss by source: plays 3.0000  chat 4.0000");
  const std::string live = live_step_line([] {
    StepMetrics m = step(10, 30);
    m.tokens_by_source = {{"plays", 4915}};
    return m;
  }(), 20);
  EXPECT_NE(live.find("load max/mean 3.84  tokens plays 4.9k"), std::string::npos) << live;
}

TEST(TrainProgressSink, OneLiveLineOnATerminal) {
  const std::string text = capture(true, 0, [](TrainProgressSink& sink) {
    sink.on_message("switchyard train: tiny");
    sink.on_step(step(10, 40));
    sink.on_step(step(20, 40));
  });
  // Two updates of one line: no newline after the message's, each redraw starts with
  // "\r" and erases what is left of the previous one.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;  // message, and the end
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 2) << text;
  const std::vector<std::string> lines = screen(text);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "switchyard train: tiny");
  EXPECT_EQ(lines[1],
            "[##########..........]  50%  step 20/40  eta 20s  |  loss 3.5000  aux 2.0000  "
            "z 1.2500  lr 3.00e-04  grad 0.750  13659 tok/s  mfu 56.9%  dropped 0.00%  "
            "load max/mean 3.84");
  EXPECT_EQ(lines[2], "");  // the sink's end left the line in place and moved below it
}

TEST(TrainProgressSink, MessagesAndEvalsGoAboveTheLiveLine) {
  const std::string text = capture(true, 0, [](TrainProgressSink& sink) {
    sink.on_step(step(10, 30));
    sink.on_message("saved checkpoint run/checkpoints/step_10");
    sink.on_step(step(20, 30));
    sink.on_eval(20, 3.0689);
    sink.on_step(step(30, 30));  // the last step stays on screen
    sink.on_message("saved final weights to run/checkpoints/final");
  });
  const std::vector<std::string> lines = screen(text);
  ASSERT_EQ(lines.size(), 5u) << text;
  EXPECT_EQ(lines[0], "saved checkpoint run/checkpoints/step_10");
  EXPECT_EQ(lines[1], "eval step 20  val_loss 3.0689");
  EXPECT_EQ(lines[2].substr(0, 44), "[####################] 100%  step 30/30  eta");
  EXPECT_EQ(lines[3], "saved final weights to run/checkpoints/final");
  EXPECT_EQ(lines[4], "");
}

TEST(TrainProgressSink, LiveLineFitsTheTerminalWidth) {
  const std::string text = capture(true, 60, [](TrainProgressSink& sink) {
    sink.on_step(step(1, 1000));
    sink.on_step(step(500, 1000));
  });
  const std::vector<std::string> lines = screen(text);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], std::string("[##########..........]  50%  step 500/1000  eta 8m20s  |  l"));
  EXPECT_EQ(lines[0].size(), 59u);
  // Messages are not cut.
  const std::string long_message(100, 'm');
  const std::string with_message = capture(true, 60, [&](TrainProgressSink& sink) {
    sink.on_step(step(1, 10));
    sink.on_message(long_message);
  });
  EXPECT_EQ(screen(with_message)[0], long_message);
}

}  // namespace
}  // namespace switchyard
