// The table `train --op-times` prints at the end of a run: where a step's time went on the
// reporting rank, by kind of work (core/runtime/op_clock.h).
#pragma once

#include <cstdint>
#include <string>

#include "core/runtime/op_clock.h"

namespace switchyard {

// `per_step`: seconds per step over `steps` steps. `flops` (forward FLOPs per token by
// kind; all zeros for none) with `tokens` per step on this rank gives each kind's
// GFLOP/s, and `peak_flops` (this rank's share of the MFU's reference) its share of it.
std::string describe_op_times(const OpTimes& per_step, int64_t steps, const OpFlops& flops,
                              double tokens, double peak_flops);

}  // namespace switchyard
