// `switchyard data prepare`: text in, a token dataset directory out (docs/data.md).
//
// Documents (see data/document_reader.h) are encoded on every core, each followed by
// the tokenizer's eos id, and appended in input order to HDF5 shards. With a chat
// template each conversation is a document, laid out by the template (an eos that carries
// no loss is appended unless the template ends it with one). Document i goes to
// the validation split when floor((i + 1) * f) > floor(i * f) for val_fraction f, which
// spreads exactly floor(n * f) validation documents evenly over the input.
//
// Shards are written under hidden temporary names and renamed once all are complete;
// the tokenizer is copied in as tokenizer.model and index.json is written last, so an
// interrupted run leaves nothing that looks like a finished shard or dataset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/progress.h"

namespace switchyard {

struct PrepareOptions {
  std::string tokenizer_path;
  std::vector<std::string> inputs;
  std::string out_dir;
  double val_fraction = 0.01;
  int64_t shard_tokens = 100'000'000;  // a shard closes at the first document end past this
  std::string text_field = "text";
  int threads = 0;  // 0: every core
  // A chat template file (data/chat_template.h): the inputs are then JSON Lines
  // conversations (data/conversation.h), and the shards get a /loss_mask that trains only
  // the roles the template marks.
  std::string chat_template;
};

struct PrepareSummary {
  int64_t input_bytes = 0;
  int64_t documents[2] = {0, 0};  // train, val
  int64_t tokens[2] = {0, 0};
  int64_t shards[2] = {0, 0};
  double seconds = 0;
};

absl::StatusOr<PrepareSummary> prepare_dataset(const PrepareOptions& options,
                                               DataProgressSink& sink);

}  // namespace switchyard
