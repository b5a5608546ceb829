// The bench subcommands of the switchyard binary:
//   switchyard bench balance RECIPE|WEIGHTS_DIR [--data DATASET_DIR | --synthetic zipf:S]
//                            [--batches N] [--ep E [--replica-slots K]]
//                            [--compare top_k=1,2,4 | gating=A,B] [--set path=value]...
//                            [--run-dir RUN_DIR] [--json FILE] [--report FILE.html]
//                            [--overwrite]
// Wiring in main(): construct BenchCommand on the app before parsing, then
//   if (bench_command.parsed()) return report(bench_command.run());
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace switchyard {

class BenchCommand {
 public:
  explicit BenchCommand(CLI::App& app);

  // Whether the parsed command line chose one of these commands.
  bool parsed() const;
  // Runs the chosen command; the table goes to stdout, errors come back.
  absl::Status run();

 private:
  absl::Status run_balance();
  absl::Status check_balance_outputs() const;

  CLI::App* bench_ = nullptr;
  CLI::App* balance_ = nullptr;

  std::string source_;
  std::string data_;
  std::string synthetic_;
  int64_t batches_ = 8;
  int ep_ = 1;
  int replica_slots_ = 0;
  std::vector<std::string> overrides_;
  std::string compare_;
  std::string run_dir_;
  std::string json_path_;
  std::string report_path_;
  bool overwrite_ = false;
};

}  // namespace switchyard
