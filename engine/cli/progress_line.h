// The training progress on the terminal. On a terminal, one live line (progress bar,
// ETA, the latest metrics) redrawn in place with a carriage return, with messages and
// evaluations printed above it; elsewhere (CI, logs, pipes), one plain line per log
// interval. The output stream and whether it is a terminal are parameters, so tests can
// feed steps and read back the text.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine/train/trainer.h"

namespace switchyard {

// "950", "12.3k", "4.56M", "7.89G"; "?" for a negative or non-finite count.
std::string format_count(double n);

// "5s", "1m30s", "2h05m"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

// The columns of the terminal on file descriptor `fd`; 0 when it is not a terminal or
// does not say.
int terminal_columns(int fd);

// The plain progress line of one logged step (no newline).
std::string step_line(const StepMetrics& m);
// The live line: progress bar of `bar_width` cells, percentage, ETA, then the metrics.
std::string live_step_line(const StepMetrics& m, int bar_width);

// One status line. Live, update() redraws it in place ("\r", the text cut to fit `width`
// columns, erase to the end of the line) and print() puts a lasting line above it; not
// live, both simply print a line.
class ProgressLine {
 public:
  // `width`: the terminal's columns, 0 for no limit.
  ProgressLine(std::FILE* out, bool live, int width);
  // Ends a live line that is still shown, so that what follows starts on its own line.
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void update(const std::string& text);
  void print(const std::string& text);
  // Leaves the live line on screen as a finished line.
  void finish();

  bool live() const { return live_; }

 private:
  void draw();
  void erase();

  std::FILE* out_;
  bool live_;
  int width_;
  std::string shown_;  // the live line on screen; empty when none
};

// The CLI's sink for `switchyard train`.
class TrainProgressSink : public ProgressSink {
 public:
  TrainProgressSink(std::FILE* out, bool live, int width) : line_(out, live, width) {}
  void on_step(const StepMetrics& m) override;
  void on_eval(int64_t step, double val_loss) override;
  void on_source_evals(int64_t step,
                       const std::vector<std::pair<std::string, double>>& losses) override;
  void on_message(const std::string& text) override;

 private:
  ProgressLine line_;
};

}  // namespace switchyard
