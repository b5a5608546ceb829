// The data subcommands of the switchyard binary:
//   switchyard data tokenizer --input FILES... --vocab-size N [--model-type bpe|unigram] --out M
//                             [--overwrite]
//   switchyard data prepare --tokenizer M --input FILES... --out DIR [--val-fraction F]
//                           [--shard-tokens N] [--text-field NAME] [--threads N]
//                           [--chat-template TEMPLATE.json] [--part I/N]
//   switchyard data merge-parts DIR
//   switchyard inspect PATH [--tokenizer M] [--sample-tokens N]
// Wiring in main(): construct DataCommands on the app before parsing, then
//   if (data_commands.parsed()) return report(data_commands.run());
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace switchyard {

class DataCommands {
 public:
  explicit DataCommands(CLI::App& app);

  // Whether the parsed command line chose one of these commands.
  bool parsed() const;
  // Runs the chosen command; progress and results go to stdout, errors come back.
  absl::Status run();

 private:
  absl::Status run_tokenizer();
  absl::Status run_prepare();
  absl::Status run_merge_parts();
  absl::Status run_inspect();

  CLI::App* data_ = nullptr;
  CLI::App* tokenizer_ = nullptr;
  CLI::App* prepare_ = nullptr;
  CLI::App* merge_parts_ = nullptr;
  CLI::App* inspect_ = nullptr;

  std::vector<std::string> inputs_;
  std::string out_;
  std::string tokenizer_path_;
  std::string text_field_ = "text";
  std::string chat_template_;
  std::string part_;
  bool overwrite_ = false;
  int threads_ = 0;
  int64_t vocab_size_ = 0;
  std::string model_type_ = "bpe";
  double val_fraction_ = 0.01;
  int64_t shard_tokens_ = 100'000'000;
  std::string inspect_path_;
  int64_t sample_tokens_ = 64;
};

}  // namespace switchyard
