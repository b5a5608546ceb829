#include "core/runtime/op_clock.h"

#include <utility>

namespace switchyard {
namespace {

OpTimes& table() {
  static OpTimes times;
  return times;
}

// The innermost open scope of this thread.
thread_local OpScope* innermost = nullptr;

}  // namespace

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kData: return "data";
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kNorm: return "norms";
    case OpKind::kAttention: return "attention projections";
    case OpKind::kAttentionCore: return "attention core";
    case OpKind::kRouter: return "router";
    case OpKind::kDispatch: return "dispatch";
    case OpKind::kExperts: return "experts";
    case OpKind::kCombine: return "combine";
    case OpKind::kSharedExperts: return "shared experts";
    case OpKind::kDenseFfn: return "dense ffn";
    case OpKind::kHead: return "head and loss";
    case OpKind::kGradients: return "gradient sync";
    case OpKind::kOptimizer: return "optimizer";
    case OpKind::kOther: return "other";
  }
  return "?";
}

double OpTimes::total() const {
  double sum = 0;
  for (const auto& pass : seconds)
    for (double s : pass) sum += s;
  return sum;
}

OpTimes& OpTimes::operator+=(const OpTimes& other) {
  for (size_t p = 0; p < seconds.size(); ++p)
    for (size_t k = 0; k < seconds[p].size(); ++k) seconds[p][k] += other.seconds[p][k];
  return *this;
}

OpTimes OpTimes::divided_by(double d) const {
  OpTimes out = *this;
  for (auto& pass : out.seconds)
    for (double& s : pass) s /= d;
  return out;
}

void OpClock::enable(bool on) {
  enabled_ = on;
  table() = {};
}

OpTimes OpClock::take() { return std::exchange(table(), {}); }

OpScope::OpScope(OpKind kind, OpPass pass, Device& dev) : on_(OpClock::enabled()) {
  if (!on_) return;
  kind_ = kind;
  pass_ = pass;
  dev_ = &dev;
  parent_ = innermost;
  innermost = this;
  dev.synchronize();
  start_ = Clock::now();
}

OpScope::~OpScope() {
  if (!on_) return;
  dev_->synchronize();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  table().seconds[static_cast<int>(pass_)][static_cast<int>(kind_)] += elapsed - inner_;
  if (parent_) parent_->inner_ += elapsed;
  innermost = parent_;
}

}  // namespace switchyard
