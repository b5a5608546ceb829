#include "engine/train/evaluation.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/runtime/rng.h"
#include "core/runtime/status_macros.h"

namespace switchyard {

namespace {

// The windows that hold eval_tokens tokens.
int64_t windows_for(int64_t seq_len, int64_t eval_tokens) {
  return (eval_tokens + seq_len - 1) / seq_len;
}

}  // namespace

int64_t evaluation_windows(const TokenDataset& data, int64_t seq_len, int64_t eval_tokens) {
  return std::min(data.num_windows(seq_len), windows_for(seq_len, eval_tokens));
}

int64_t evaluation_windows_per_forward(int64_t seq_len) {
  return std::clamp<int64_t>(kEvalForwardTokens / seq_len, 1, kEvalMaxWindowsPerForward);
}

int64_t evaluation_batch_windows(int64_t seq_len, int64_t eval_tokens) {
  return std::min(evaluation_windows_per_forward(seq_len), windows_for(seq_len, eval_tokens));
}

absl::StatusOr<EvalResult> evaluate_windows(Device& dev, Transformer& model,
                                            const TokenDataset& data, int64_t seq_len,
                                            int64_t windows, Communicator* replicas) {
  const EvalForward forward = [&](const Tensor& ids, const Tensor& targets,
                                  const Tensor& doc_starts, const Tensor& window_tokens) {
    return model.evaluate(dev, ids, targets, Rng(0), nullptr, doc_starts, window_tokens);
  };
  return evaluate_windows(forward, data, seq_len, windows, replicas);
}

absl::StatusOr<EvalResult> evaluate_windows(const EvalForward& forward, const TokenDataset& data,
                                            int64_t seq_len, int64_t windows,
                                            Communicator* replicas) {
  const int64_t size = replicas ? replicas->size() : 1;
  const int64_t index = replicas ? replicas->rank() : 0;
  const int64_t per_forward = evaluation_windows_per_forward(seq_len);
  const int64_t batches = (windows + per_forward - 1) / per_forward;
  std::vector<double> losses(size);
  std::vector<int64_t> tokens(size);
  EvalResult result;
  double sum = 0;
  for (int64_t first = 0; first < batches; first += size) {
    // A replica past the last batch evaluates batch 0 and drops it, so that every
    // replica runs the same forwards (expert parallelism and ZeRO-3 communicate in them).
    const int64_t batch = first + index;
    const bool mine = batch < batches;
    const int64_t begin = mine ? batch * per_forward : 0;
    const int64_t count = std::min(per_forward, windows - begin);
    Tensor ids = Tensor::empty({count, seq_len}, DType::kI32);
    Tensor targets = Tensor::empty({count, seq_len}, DType::kI32);
    Tensor doc_starts =
        data.has_documents() ? Tensor::empty({count, seq_len}, DType::kI32) : Tensor();
    Tensor window_tokens = data.pads_documents() ? Tensor::empty({count}, DType::kI32) : Tensor();
    for (int64_t w = 0; w < count; ++w) {
      SY_RETURN_IF_ERROR(data.read_window(begin + w, seq_len, ids.data<int32_t>() + w * seq_len,
                                          targets.data<int32_t>() + w * seq_len));
      if (data.has_documents())
        data.window_document_starts(begin + w, seq_len, doc_starts.data<int32_t>() + w * seq_len);
      if (data.pads_documents())
        window_tokens.data<int32_t>()[w] =
            static_cast<int32_t>(data.window_tokens(begin + w, seq_len));
    }
    const LossParts parts = forward(ids, targets, doc_starts, window_tokens);
    std::fill(losses.begin(), losses.end(), 0.0);
    std::fill(tokens.begin(), tokens.end(), 0);
    if (mine) {
      losses[index] = parts.cross_entropy * static_cast<double>(parts.target_tokens);
      tokens[index] = parts.target_tokens;
    }
    // Each entry has one contributor, so the sums are exact and the order below is the
    // batches' own.
    if (replicas) {
      replicas->all_reduce_sum(losses.data(), size);
      replicas->all_reduce_sum(tokens.data(), size);
    }
    for (int64_t r = 0; r < size; ++r) {
      sum += losses[r];
      result.tokens += tokens[r];
    }
  }
  if (result.tokens == 0)
    return absl::InvalidArgumentError(absl::StrCat(
        data.dir(), ": the ", windows, " evaluation windows of its ", data.split(),
        " split hold no token that carries loss (a loss mask of zeros): a loss over no token "
        "means nothing"));
  result.loss = sum / static_cast<double>(result.tokens);
  return result;
}

absl::StatusOr<BlendEvalResult> evaluate_blend(const EvalForward& forward,
                                               const std::vector<EvalSource>& sources,
                                               int64_t seq_len, Communicator* replicas) {
  BlendEvalResult result;
  double total_weight = 0;
  for (const EvalSource& source : sources) total_weight += source.weight;
  for (const EvalSource& source : sources) {
    SY_ASSIGN_OR_RETURN(const EvalResult one, evaluate_windows(forward, *source.data, seq_len,
                                                               source.windows, replicas));
    result.by_source.emplace_back(source.name, one.loss);
    result.loss += source.weight / total_weight * one.loss;
  }
  return result;
}

}  // namespace switchyard
