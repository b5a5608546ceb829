// Command-line access to the data library for the h5py / sentencepiece interop test
// (test_h5py_interop.py). Prints JSON on stdout; an error is one line on stderr, exit 1.
//   token_tool train MODEL VOCAB TEXT_FILE [bpe|unigram]
//   token_tool encode MODEL TEXT_FILE          -> [ids]
//   token_tool prepare MODEL DIR TEXT_FILE VAL_FRACTION SHARD_TOKENS
//   token_tool read DIR SPLIT                  -> [the split's token stream]
//   token_tool windows DIR SEQ SEED GLOBAL_BATCH RANK SIZE COUNT -> [[window ids]...]
//   token_tool inspect PATH                    -> {"shards": N, "tokens": N}
//   token_tool open DIR SPLIT hash|remembered|unverified -> {"seconds": X, "tokens": N}
//   token_tool bench-loader DIR SEQ GLOBAL_BATCH STEPS -> {"tokens_per_s": X, ...}
//       (for bench/prepare_throughput.py)
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/runtime/status_macros.h"
#include "data/inspect.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"

namespace switchyard {
namespace {

absl::StatusOr<std::string> read_text(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::NotFoundError(path + ": cannot open");
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  std::fclose(f);
  return text;
}

absl::Status run(const std::vector<std::string>& a) {
  if (a.empty())
    return absl::InvalidArgumentError("usage: token_tool COMMAND ARGS... (see the source)");
  DataProgressSink quiet;
  const std::string& command = a[0];
  if (command == "train") {
    TokenizerTrainOptions options;
    options.inputs = {a.at(3)};
    options.vocab_size = std::stoll(a.at(2));
    if (a.size() > 4) options.model_type = a[4];
    return train_tokenizer(options, a.at(1), quiet);
  }
  if (command == "encode") {
    SY_ASSIGN_OR_RETURN(const Tokenizer tokenizer, Tokenizer::load(a.at(1)));
    SY_ASSIGN_OR_RETURN(const std::string text, read_text(a.at(2)));
    std::printf("%s\n", nlohmann::json(tokenizer.encode(text)).dump().c_str());
    return absl::OkStatus();
  }
  if (command == "prepare") {
    PrepareOptions options;
    options.tokenizer_path = a.at(1);
    options.out_dir = a.at(2);
    options.inputs = {a.at(3)};
    options.val_fraction = std::stod(a.at(4));
    options.shard_tokens = std::stoll(a.at(5));
    return prepare_dataset(options, quiet).status();
  }
  if (command == "open") {
    DatasetOpenOptions options;
    options.verify_checksums = a.at(3) != "unverified";
    options.remember_verdicts = a.at(3) == "remembered";
    const auto start = std::chrono::steady_clock::now();
    SY_ASSIGN_OR_RETURN(const TokenDataset dataset, TokenDataset::open(a.at(1), a.at(2), options));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "%s\n",
        nlohmann::json({{"seconds", seconds}, {"tokens", dataset.num_tokens()}}).dump().c_str());
    return absl::OkStatus();
  }
  if (command == "read") {
    SY_ASSIGN_OR_RETURN(const TokenDataset dataset, TokenDataset::open(a.at(1), a.at(2)));
    std::vector<int32_t> ids(static_cast<size_t>(dataset.num_tokens()));
    SY_RETURN_IF_ERROR(dataset.read_tokens(0, dataset.num_tokens(), ids.data()));
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
    return absl::OkStatus();
  }
  if (command == "windows") {
    SY_ASSIGN_OR_RETURN(const TokenDataset dataset, TokenDataset::open(a.at(1), "train"));
    LoaderOptions o;
    o.seq_len = std::stoll(a.at(2));
    o.seed = std::stoull(a.at(3));
    o.global_batch = std::stoll(a.at(4));
    o.dp_rank = std::stoi(a.at(5));
    o.dp_size = std::stoi(a.at(6));
    SY_ASSIGN_OR_RETURN(const std::unique_ptr<Loader> loader, Loader::create(dataset, o));
    nlohmann::json out = nlohmann::json::array();
    std::vector<int32_t> ids(o.seq_len), targets(o.seq_len);
    for (int64_t i = 0; i < std::stoll(a.at(7)); ++i) {
      SY_RETURN_IF_ERROR(loader->next_batch(1, ids.data(), targets.data()));
      std::vector<int32_t> window = ids;
      window.push_back(targets.back());
      out.push_back(window);
    }
    std::printf("%s\n", out.dump().c_str());
    return absl::OkStatus();
  }
  if (command == "inspect") {
    SY_ASSIGN_OR_RETURN(const InspectReport report, inspect_token_data(a.at(1), {}));
    int64_t tokens = 0;
    for (const ShardReport& s : report.shards) tokens += s.tokens;
    std::printf(
        "%s\n",
        nlohmann::json({{"shards", report.shards.size()}, {"tokens", tokens}}).dump().c_str());
    return absl::OkStatus();
  }
  if (command == "bench-loader") {
    SY_ASSIGN_OR_RETURN(const TokenDataset dataset, TokenDataset::open(a.at(1), "train"));
    LoaderOptions o;
    o.seq_len = std::stoll(a.at(2));
    o.global_batch = std::stoll(a.at(3));
    const int64_t steps = std::stoll(a.at(4));
    SY_ASSIGN_OR_RETURN(const std::unique_ptr<Loader> loader, Loader::create(dataset, o));
    std::vector<int32_t> ids(o.global_batch * o.seq_len), targets(ids.size());
    const auto start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < steps; ++s)
      SY_RETURN_IF_ERROR(loader->next_batch(o.global_batch, ids.data(), targets.data()));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tokens = static_cast<double>(steps * o.global_batch * o.seq_len);
    std::printf("%s\n", nlohmann::json({{"tokens", tokens},
                                        {"seconds", seconds},
                                        {"tokens_per_s", tokens / seconds},
                                        {"windows_per_epoch", loader->windows_per_epoch()}})
                            .dump()
                            .c_str());
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown command " + command);
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  const absl::Status status = switchyard::run(std::vector<std::string>(argv + 1, argv + argc));
  if (status.ok()) return 0;
  std::fprintf(stderr, "token_tool: error: %s\n", std::string(status.message()).c_str());
  return 1;
}
