// The validation figure, one definition for the trainer's evaluations and for
// `switchyard eval`: the mean cross-entropy over a fixed set of windows, whatever the
// batch shapes, the parallel layout or the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/communicator.h"
#include "data/token_dataset.h"
#include "engine/model/transformer.h"

namespace switchyard {

// Windows per evaluation forward: a batch fixed by seq_len alone, so that each batch's
// losses are the same whatever the training batch size and layout. Up to 8 windows, so
// that the matrix products run at speed, but no more than kEvalForwardTokens tokens (and
// at least one window): a long-sequence run does not put more tokens through a layer than
// a training micro-batch of one such window does.
inline constexpr int64_t kEvalMaxWindowsPerForward = 8;
inline constexpr int64_t kEvalForwardTokens = 4096;
int64_t evaluation_windows_per_forward(int64_t seq_len);

// The evaluation windows: the first ceil(eval_tokens / seq_len) packed windows of the
// split (TokenDataset::read_window), in order, or all of them when the split has fewer.
int64_t evaluation_windows(const TokenDataset& data, int64_t seq_len, int64_t eval_tokens);

// The most windows one evaluation forward holds (what the memory plan counts): a whole
// batch, or every window when eval_tokens asks for fewer.
int64_t evaluation_batch_windows(int64_t seq_len, int64_t eval_tokens);

struct EvalResult {
  double loss = 0;     // mean cross-entropy per target token
  int64_t tokens = 0;  // target tokens evaluated
};

// Evaluates windows [0, windows) of `data` in fixed batches of consecutive windows. The
// data-parallel replicas (`replicas`, null for one) take the batches round-robin; each
// round's losses are summed over them and added in batch order, so the figure is the
// same for any number of replicas. Every rank of the model's groups must call it. A
// dataset opened with_documents is evaluated with document-aware attention.
absl::StatusOr<EvalResult> evaluate_windows(Device& dev, Transformer& model,
                                            const TokenDataset& data, int64_t seq_len,
                                            int64_t windows, Communicator* replicas);

// An evaluation forward of one batch, (batch, seq) i32 ids, targets and document starts
// (undefined without documents), and (batch) i32 window tokens (undefined but for padded
// windows; Transformer::forward): its cross-entropy parts. A model's forward, or a
// forward through pipeline stages.
using EvalForward = std::function<LossParts(const Tensor& ids, const Tensor& targets,
                                            const Tensor& doc_starts,
                                            const Tensor& window_tokens)>;

// evaluate_windows with `forward` in place of a model's.
absl::StatusOr<EvalResult> evaluate_windows(const EvalForward& forward, const TokenDataset& data,
                                            int64_t seq_len, int64_t windows,
                                            Communicator* replicas);

// One validation set of a blend: its name, split, weight and evaluation windows.
struct EvalSource {
  std::string name;
  const TokenDataset* data = nullptr;
  double weight = 1;
  int64_t windows = 0;
};

struct BlendEvalResult {
  // The sources' losses averaged with the blend's weights (normalised): the loss expected
  // on the training mixture. With one source, its own loss.
  double loss = 0;
  std::vector<std::pair<std::string, double>> by_source;  // (name, loss), in blend order
};

// Evaluates every source with evaluate_windows.
absl::StatusOr<BlendEvalResult> evaluate_blend(const EvalForward& forward,
                                               const std::vector<EvalSource>& sources,
                                               int64_t seq_len, Communicator* replicas);

}  // namespace switchyard
