// The convert subcommands of the switchyard binary:
//   switchyard convert to-hf WEIGHTS_DIR OUT [--dtype bf16|fp32] [--max-shard-size 5GB]
//                            [--overwrite]
//   switchyard convert from-hf HF_DIR OUT_WEIGHTS_DIR [--overwrite]
//   switchyard convert upcycle HF_DENSE_DIR OUT_WEIGHTS_DIR --experts E --top-k K
//                              [--granularity G] [--seed N] [--overwrite]
// Wiring in main(): construct ConvertCommand on the app before parsing, then
//   if (convert_command.parsed()) return report(convert_command.run());
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace switchyard {

class ConvertCommand {
 public:
  explicit ConvertCommand(CLI::App& app);

  // Whether the parsed command line chose one of these commands.
  bool parsed() const;
  // Runs the chosen command; the result line goes to stdout, errors come back.
  absl::Status run();

 private:
  absl::Status run_to_hf();
  absl::Status run_from_hf();
  absl::Status run_upcycle();

  CLI::App* convert_ = nullptr;
  CLI::App* to_hf_ = nullptr;
  CLI::App* from_hf_ = nullptr;
  CLI::App* upcycle_ = nullptr;

  std::string in_;
  std::string out_;
  std::string dtype_ = "fp32";
  std::string max_shard_size_ = "5GB";
  bool overwrite_ = false;
  int64_t experts_ = 0;
  int64_t top_k_ = 0;
  int64_t granularity_ = 1;
  uint64_t seed_ = 0;
};

}  // namespace switchyard
