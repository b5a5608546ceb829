#include "engine/train/op_times_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace switchyard {

std::string describe_op_times(const OpTimes& per_step, int64_t steps, const OpFlops& flops,
                              double tokens, double peak_flops) {
  const double step_s = per_step.total();
  std::string out = absl::StrFormat(
      "where a step went on rank 0 (mean of %d steps, %.1f ms each; a backward's FLOPs are "
      "twice its forward's):\n%-22s %10s %11s %7s %9s %8s",
      steps, 1e3 * step_s, "", "forward ms", "backward ms", "share", "GFLOP/s", "of peak");
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    const double fwd = per_step.at(kind, OpPass::kForward);
    const double bwd = per_step.at(kind, OpPass::kBackward);
    if (fwd + bwd <= 0) continue;
    const double rate = flops[k] > 0 ? 3 * flops[k] * tokens / (fwd + bwd) : 0;
    absl::StrAppend(&out, absl::StrFormat("\n%-22s %10.2f %11.2f %6.1f%%", op_kind_name(kind),
                                          1e3 * fwd, 1e3 * bwd, 100 * (fwd + bwd) / step_s));
    if (rate > 0) {
      absl::StrAppend(&out, absl::StrFormat(" %9.1f", rate / 1e9));
      if (peak_flops > 0)
        absl::StrAppend(&out, absl::StrFormat(" %7.1f%%", 100 * rate / peak_flops));
    }
  }
  return out;
}

}  // namespace switchyard
