// `switchyard data prepare`: text in, a token dataset directory out (docs/data.md).
//
// Documents (see data/document_reader.h) are encoded on every core, each followed by
// the tokenizer's eos id, and appended in input order to HDF5 shards. With a chat
// template each conversation is a document, laid out by the template (an eos that carries
// no loss is appended unless the template ends it with one). Document i goes to
// the validation split when floor((i + 1) * f) > floor(i * f) for val_fraction f, which
// spreads exactly floor(n * f) validation documents evenly over the input.
//
// A prepare is one part (data/prepare_parts.h): its shards are written under hidden names
// and recorded, one by one, in its part record. A killed prepare rerun with the same
// arguments continues after the last complete shard and makes the same bytes; other
// arguments or changed inputs are refused. Without --part the one part is then merged: the
// shards are renamed to their final names, the tokenizer is copied in as tokenizer.model
// and index.json is written last, so an interrupted run leaves nothing that looks like a
// finished dataset. A prepare that fails (an error, not a kill) removes its part.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/prepare_parts.h"
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
  // --part: make this part of the dataset and leave the merge to merge_parts. Without it,
  // the whole dataset (part 0 of 1, merged).
  std::optional<PartId> part;
};

struct PrepareSummary {
  int64_t input_bytes = 0;
  int64_t documents[2] = {0, 0};  // train, val
  int64_t tokens[2] = {0, 0};
  int64_t shards[2] = {0, 0};
  int64_t shards_resumed = 0;  // complete shards an earlier, killed run had left
  double seconds = 0;
};

absl::StatusOr<PrepareSummary> prepare_dataset(const PrepareOptions& options,
                                               DataProgressSink& sink);

// `data merge-parts DIR`: checks that every part of one prepare is in `dir`, finished, made
// with the same arguments and inputs, and that its shards are the ones it recorded (size
// and sha256), then renames them to the dataset's names, writes index.json and removes
// the part records. A merge interrupted while renaming can be run again.
absl::StatusOr<PrepareSummary> merge_parts(const std::string& dir, DataProgressSink& sink);

}  // namespace switchyard
