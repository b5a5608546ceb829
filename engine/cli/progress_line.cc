#include "engine/cli/progress_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace switchyard {

namespace {

constexpr int kBarCells = 20;
constexpr char kEraseToEnd[] = "\x1b[K";

// "  tokens web 1.2M chat 301.5k" for a blend, "" otherwise.
std::string source_tokens(const StepMetrics& m) {
  if (m.tokens_by_source.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [name, tokens] : m.tokens_by_source)
    parts.push_back(absl::StrCat(name, " ", format_count(static_cast<double>(tokens))));
  return absl::StrCat("  tokens ", absl::StrJoin(parts, " "));
}

// "  seq-aux 1.2345" with the sequence-wise aux loss, "  mtp 2.3456" with MTP modules,
// "" without either.
std::string extra_loss_terms(const StepMetrics& m) {
  return absl::StrCat(m.seq_aux_loss ? absl::StrFormat("  seq-aux %.4f", *m.seq_aux_loss) : "",
                      m.mtp_loss ? absl::StrFormat("  mtp %.4f", *m.mtp_loss) : "");
}

}  // namespace

std::string format_count(double n) {
  if (!std::isfinite(n) || n < 0) return "?";
  if (n >= 1e9) return absl::StrFormat("%.2fG", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = static_cast<long long>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%lldh%02lldm", t / 3600, (t / 60) % 60);
  if (t >= 60) return absl::StrFormat("%lldm%02llds", t / 60, t % 60);
  return absl::StrFormat("%llds", t);
}

int terminal_columns(int fd) {
  winsize size{};
  if (ioctl(fd, TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

std::string step_line(const StepMetrics& m) {
  return absl::StrFormat(
      "step %5lld/%lld  loss %.4f  aux %.4f  z %.4f%s  lr %.2e  grad %.3f  %.0f tok/s  "
      "mfu %.1f%%  dropped %.2f%%  load max/mean %.2f  eta %s%s",
      static_cast<long long>(m.step), static_cast<long long>(m.total_steps), m.loss, m.aux_loss,
      m.z_loss, extra_loss_terms(m), m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu,
      100.0 * m.dropped_fraction, m.worst_load_ratio, format_duration(m.eta_s), source_tokens(m));
}

std::string live_step_line(const StepMetrics& m, int bar_width) {
  const double done =
      m.total_steps > 0 ? std::clamp(static_cast<double>(m.step) / m.total_steps, 0.0, 1.0) : 0;
  const int filled = static_cast<int>(done * bar_width);
  return absl::StrFormat(
      "[%s%s] %3.0f%%  step %lld/%lld  eta %s  |  loss %.4f  aux %.4f  z %.4f%s  lr %.2e  "
      "grad %.3f  %.0f tok/s  mfu %.1f%%  dropped %.2f%%  load max/mean %.2f%s",
      std::string(filled, '#'), std::string(bar_width - filled, '.'), 100.0 * done,
      static_cast<long long>(m.step), static_cast<long long>(m.total_steps),
      format_duration(m.eta_s), m.loss, m.aux_loss, m.z_loss, extra_loss_terms(m), m.lr,
      m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, 100.0 * m.dropped_fraction, m.worst_load_ratio, source_tokens(m));
}

ProgressLine::ProgressLine(std::FILE* out, bool live, int width)
    : out_(out), live_(live), width_(width) {}

ProgressLine::~ProgressLine() { finish(); }

void ProgressLine::draw() {
  // A line as wide as the terminal would wrap (or park the cursor past the last column),
  // and "\r" would then return only to the start of its last row.
  const std::string text = width_ > 1 && static_cast<int>(shown_.size()) >= width_
                               ? shown_.substr(0, width_ - 1)
                               : shown_;
  std::fprintf(out_, "\r%s%s", text.c_str(), kEraseToEnd);
}

void ProgressLine::erase() { std::fprintf(out_, "\r%s", kEraseToEnd); }

void ProgressLine::update(const std::string& text) {
  if (!live_) {
    std::fprintf(out_, "%s\n", text.c_str());
  } else {
    shown_ = text;
    draw();
  }
  std::fflush(out_);
}

void ProgressLine::print(const std::string& text) {
  if (live_ && !shown_.empty()) {
    erase();
    std::fprintf(out_, "%s\n", text.c_str());
    draw();
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (shown_.empty()) return;
  std::fprintf(out_, "\n");
  std::fflush(out_);
  shown_.clear();
}

void TrainProgressSink::on_step(const StepMetrics& m) {
  if (!line_.live()) {
    line_.update(step_line(m));
    return;
  }
  line_.update(live_step_line(m, kBarCells));
  if (m.step >= m.total_steps) line_.finish();
}

void TrainProgressSink::on_eval(int64_t step, double val_loss) {
  line_.print(
      absl::StrFormat("eval step %lld  val_loss %.4f", static_cast<long long>(step), val_loss));
}

void TrainProgressSink::on_source_evals(
    int64_t step, const std::vector<std::pair<std::string, double>>& losses) {
  std::vector<std::string> parts;
  for (const auto& [name, loss] : losses) parts.push_back(absl::StrFormat("%s %.4f", name, loss));
  line_.print(absl::StrFormat("eval step %lld  val_loss by source: %s",
                              static_cast<long long>(step), absl::StrJoin(parts, "  ")));
}

void TrainProgressSink::on_message(const std::string& text) { line_.print(text); }

}  // namespace switchyard
