// The validation figure, one definition for the trainer's evaluations and for
// `switchyard eval`: the mean cross-entropy over a fixed set of windows, whatever the
// batch shapes, the parallel layout or the thread count.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "data/token_dataset.h"
#include "engine/model/transformer.h"
#include "engine/parallel/communicator.h"

namespace switchyard {

// The evaluation windows: the first ceil(eval_tokens / seq_len) packed windows of the
// split (TokenDataset::read_window), in order, or all of them when the split has fewer.
int64_t evaluation_windows(const TokenDataset& data, int64_t seq_len, int64_t eval_tokens);

struct EvalResult {
  double loss = 0;     // mean cross-entropy per target token
  int64_t tokens = 0;  // target tokens evaluated
};

// Evaluates windows [0, windows) of `data` in fixed batches of consecutive windows. The
// data-parallel replicas (`replicas`, null for one) take the batches round-robin; each
// round's losses are summed over them and added in batch order, so the figure is the
// same for any number of replicas. Every rank of the model's groups must call it.
absl::StatusOr<EvalResult> evaluate_windows(Device& dev, Transformer& model,
                                            const TokenDataset& data, int64_t seq_len,
                                            int64_t windows, Communicator* replicas);

}  // namespace switchyard
