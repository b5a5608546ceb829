// Where a training step's time goes: wall time per kind of work, forward and backward
// apart (`switchyard train --op-times`). Off unless enabled; a scope then costs a load
// and a branch. Scopes nest, and each adds to its own kind only the time it spent outside
// the scopes opened inside it, so the kinds add up to the time inside the outermost
// scope (the trainer's step). A scope is timed on the thread that opens it; on a device
// that queues work (CUDA) it synchronises at both ends, so that the queued work counts
// where it was issued.
#pragma once

#include <array>
#include <chrono>
#include <string_view>

#include "core/runtime/device.h"

namespace switchyard {

enum class OpKind : int {
  kData,        // the next batch: reading, copying to the device
  kEmbedding,   // token embedding lookup and its gradient
  kNorm,        // RMSNorms of the blocks and the final norm
  kAttention,   // attention's projections, rotary embedding and q/k norms
  kAttentionCore,  // the attention kernel itself (scores, softmax, values)
  kRouter,      // router logits, gating, routing sums and the router losses' gradients
  kDispatch,    // permuting tokens into expert order and the exchange to the experts
  kExperts,     // the routed experts' GEMMs and SwiGLU
  kCombine,     // the exchange back and the weighted sum into token order
  kSharedExperts,
  kDenseFfn,    // the FFN of dense layers
  kHead,        // LM head and cross-entropy
  kGradients,   // gradient reductions over ranks and the gradient norm
  kOptimizer,   // the parameter update
  kOther,       // the rest of a step: everything outside the scopes above
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kOther) + 1;

std::string_view op_kind_name(OpKind kind);

enum class OpPass : int { kForward, kBackward };

// Seconds per kind and pass.
struct OpTimes {
  std::array<std::array<double, kNumOpKinds>, 2> seconds{};
  double at(OpKind kind, OpPass pass) const {
    return seconds[static_cast<int>(pass)][static_cast<int>(kind)];
  }
  double total() const;
  OpTimes& operator+=(const OpTimes& other);
  OpTimes divided_by(double d) const;
};

// Forward FLOPs per token by kind (a backward does twice its forward's).
using OpFlops = std::array<double, kNumOpKinds>;

// The process's clock: one table, written by the thread that trains.
class OpClock {
 public:
  static void enable(bool on);
  static bool enabled() { return enabled_; }
  // The times since the last take(), which starts a new interval.
  static OpTimes take();

 private:
  static inline bool enabled_ = false;
};

// Times the enclosing block as `kind` in `pass` while the clock is enabled.
class OpScope {
 public:
  OpScope(OpKind kind, OpPass pass, Device& dev);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  bool on_ = false;
  OpKind kind_ = OpKind::kOther;
  OpPass pass_ = OpPass::kForward;
  Device* dev_ = nullptr;
  OpScope* parent_ = nullptr;
  Clock::time_point start_;
  double inner_ = 0;  // seconds of the scopes opened inside this one
};

}  // namespace switchyard
