// The sample subcommand of the switchyard binary:
//   switchyard sample WEIGHTS_DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
//                     [--top-p P] [--seed S] [--ignore-eos] [--stop STRING ...] [--ids]
//                     [--no-kv-cache]
// Wiring in main(): construct SampleCommand on the app before parsing, then
//   if (sample_command.parsed()) return report(sample_command.run());
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace switchyard {

class SampleCommand {
 public:
  explicit SampleCommand(CLI::App& app);

  // Whether the parsed command line chose this command.
  bool parsed() const;
  // Generates; the text (or the ids as JSON) goes to stdout, errors come back.
  absl::Status run();

 private:
  // The flags' values, before any file is read.
  absl::Status check_flags() const;

  CLI::App* sample_ = nullptr;
  CLI::Option* tokens_option_ = nullptr;
  CLI::Option* seed_option_ = nullptr;

  std::string weights_dir_;
  std::string prompt_;
  int64_t tokens_ = 200;  // given, or the most the model's context leaves room for
  double temperature_ = 0.8;
  int64_t top_k_ = 0;
  double top_p_ = 1.0;
  uint64_t seed_ = 0;
  bool ignore_eos_ = false;
  std::vector<std::string> stops_;
  bool print_ids_ = false;
  bool no_kv_cache_ = false;
};

}  // namespace switchyard
