#include "engine/cli/bench_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/weights.h"
#include "data/corpus_cache.h"
#include "data/token_dataset.h"
#include "engine/config/recipe.h"
#include "engine/model/transformer.h"
#include "engine/runtime/status_macros.h"
#include "kernels/threads.h"
#include "moe/balance_stats.h"

namespace switchyard {

namespace {

namespace fs = std::filesystem;

// A recipe or a weights directory, ready to run forward passes.
struct BenchModel {
  config::Recipe recipe;
  ParamStore params;
  std::unique_ptr<Transformer> model;
};

absl::Status load_bench_model(const std::string& source, BenchModel& out) {
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    SY_ASSIGN_OR_RETURN(out.recipe, load_weights_recipe(source));
  } else if (fs::is_regular_file(source, ec)) {
    SY_ASSIGN_OR_RETURN(out.recipe, config::load_recipe(source, {}));
  } else {
    return absl::NotFoundError(
        absl::StrCat(source, ": no such recipe file or weights directory"));
  }
  if (out.recipe.moe().num_experts() <= 0)
    return absl::InvalidArgumentError(absl::StrCat(source, ": the model has no MoE layers"));
  set_cpu_threads(out.recipe.runtime().threads());
  out.model = std::make_unique<Transformer>(out.recipe, out.params);
  out.params.allocate(cpu_device());
  if (fs::is_directory(source, ec)) return load_weights(source, out.params);
  // A recipe is measured at its seeded initialisation, as training starts from it.
  out.params.initialize(out.recipe.train().seed());
  return absl::OkStatus();
}

// "zipf:S" with S > 0 -> S.
absl::StatusOr<double> parse_zipf(const std::string& spec) {
  double s = 0;
  if (spec.rfind("zipf:", 0) != 0 || !absl::SimpleAtod(spec.substr(5), &s) || !std::isfinite(s) ||
      s <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--synthetic ", spec, ": expected zipf:S with S > 0"));
  return s;
}

// Fills (batch, seq) ids and targets, batch after batch.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual absl::Status next(int64_t batch, int64_t seq, int32_t* ids, int32_t* targets) = 0;
};

// Token i of the vocabulary with probability proportional to 1 / (i + 1)^S.
class ZipfSource : public TokenSource {
 public:
  ZipfSource(double s, int64_t vocab, uint64_t seed) : rng_(seed), cdf_(vocab) {
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) cdf_[i] = sum += std::pow(static_cast<double>(i + 1), -s);
    for (double& c : cdf_) c /= sum;
  }
  absl::Status next(int64_t batch, int64_t seq, int32_t* ids, int32_t* targets) override {
    // Each window is seq + 1 draws: the ids and, shifted by one, their targets.
    for (int64_t b = 0; b < batch; ++b) {
      int32_t token = draw();
      for (int64_t i = b * seq; i < (b + 1) * seq; ++i) {
        ids[i] = token;
        targets[i] = token = draw();
      }
    }
    return absl::OkStatus();
  }

 private:
  int32_t draw() {
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), rng_.uniform());
    return static_cast<int32_t>(std::min<ptrdiff_t>(it - cdf_.begin(), cdf_.size() - 1));
  }
  Rng rng_;
  std::vector<double> cdf_;
};

// Consecutive windows of the train split, wrapping around.
class DatasetSource : public TokenSource {
 public:
  explicit DatasetSource(TokenDataset dataset) : dataset_(std::move(dataset)) {}
  absl::Status next(int64_t batch, int64_t seq, int32_t* ids, int32_t* targets) override {
    const int64_t windows = dataset_.num_windows(seq);
    if (windows == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "the train split is shorter than one window of ", seq + 1, " tokens"));
    for (int64_t b = 0; b < batch; ++b, ++window_)
      SY_RETURN_IF_ERROR(
          dataset_.read_window(window_ % windows, seq, ids + b * seq, targets + b * seq));
    return absl::OkStatus();
  }

 private:
  TokenDataset dataset_;
  int64_t window_ = 0;
};

class PrintMessages : public DataProgressSink {
 public:
  void on_message(const std::string& text) override {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
};

absl::StatusOr<std::unique_ptr<TokenSource>> make_source(const config::Recipe& recipe,
                                                         const std::string& data,
                                                         const std::string& synthetic) {
  if (!synthetic.empty()) {
    if (!data.empty()) return absl::InvalidArgumentError("--data and --synthetic exclude each other");
    SY_ASSIGN_OR_RETURN(const double s, parse_zipf(synthetic));
    return std::make_unique<ZipfSource>(s, recipe.model().vocab_size(), recipe.train().seed());
  }
  std::string dir = data;
  if (dir.empty() && !recipe.data().corpus().empty()) {
    // The trainer's preparation: the same cached dataset a training run would use.
    PrintMessages messages;
    CorpusDatasetOptions options;
    options.vocab_size = recipe.model().vocab_size();
    options.val_fraction = recipe.data().val_fraction();
    SY_ASSIGN_OR_RETURN(dir, ensure_prepared_corpus(recipe.data().corpus(), options, messages));
  } else if (dir.empty()) {
    dir = recipe.data().dataset();
  }
  if (dir.empty())
    return absl::InvalidArgumentError("no data: pass --data DATASET_DIR or --synthetic zipf:S");
  SY_ASSIGN_OR_RETURN(TokenDataset dataset, TokenDataset::open(dir, "train"));
  return std::make_unique<DatasetSource>(std::move(dataset));
}

RoutingSample to_sample(const MoeRouting& r) {
  RoutingSample s;
  s.tokens = r.probs.rows();
  auto copy = [](const Tensor& t, auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    v.assign(t.data<T>(), t.data<T>() + t.numel());
  };
  copy(r.expert_ids, s.expert_ids);
  copy(r.weights, s.weights);
  copy(r.probs, s.probs);
  copy(r.logits, s.logits);
  return s;
}

std::string factor_name(double cf) {
  std::string name = absl::StrFormat("%g", cf);
  return name.find('.') == std::string::npos ? name + ".0" : name;
}

nlohmann::ordered_json to_json(const BalanceSummary& s) {
  nlohmann::ordered_json dropped = nlohmann::ordered_json::object();
  for (size_t i = 0; i < s.dropped.size(); ++i)
    dropped[factor_name(kBalanceCapacityFactors[i])] = s.dropped[i];
  nlohmann::ordered_json j = {{"tokens_per_expert", s.tokens_per_expert},
                              {"share", s.share},
                              {"imbalance", s.imbalance},
                              {"cv", s.cv},
                              {"entropy", s.entropy},
                              {"entropy_fraction", s.entropy_fraction},
                              {"dropped", dropped},
                              {"aux_loss", s.aux_loss},
                              {"z_loss", s.z_loss}};
  if (s.has_all_to_all)
    j["all_to_all"] = {{"sent_bytes", s.all_to_all.sent_bytes},
                       {"received_bytes", s.all_to_all.received_bytes},
                       {"sent_imbalance", s.all_to_all.sent_imbalance},
                       {"received_imbalance", s.all_to_all.received_imbalance},
                       {"imbalance", s.all_to_all.imbalance}};
  return j;
}

void print_row(const std::string& name, const BalanceSummary& s) {
  std::printf("%-8s %9.3f %7.3f %8.3f %6.1f%%", name.c_str(), s.imbalance, s.cv, s.entropy,
              100.0 * s.entropy_fraction);
  for (double d : s.dropped) std::printf(" %7.2f%%", 100.0 * d);
  std::printf(" %8.4f %8.4f", s.aux_loss, s.z_loss);
  if (s.has_all_to_all) std::printf(" %8.3f", s.all_to_all.imbalance);
  std::printf("\n");
}

void print_table(const std::vector<BalanceSummary>& layers, const BalanceSummary& overall) {
  std::printf("%-8s %9s %7s %8s %7s", "layer", "max/mean", "cv", "entropy", "of lnE");
  for (double cf : kBalanceCapacityFactors)
    std::printf(" %8s", absl::StrCat("drop@", factor_name(cf)).c_str());
  std::printf(" %8s %8s", "aux", "z");
  if (overall.has_all_to_all) std::printf(" %8s", "a2a max");
  std::printf("\n");
  for (size_t l = 0; l < layers.size(); ++l) print_row(absl::StrCat(l), layers[l]);
  print_row("overall", overall);
  if (overall.has_all_to_all) {
    const AllToAllStats& a = overall.all_to_all;
    for (size_t p = 0; p < a.sent_bytes.size(); ++p)
      std::printf("rank %zu: sent %.3f MB, received %.3f MB\n", p, a.sent_bytes[p] / 1e6,
                  a.received_bytes[p] / 1e6);
  }
}

// White (no load) through the uniform share (light red) to dark red at twice uniform.
std::string share_color(double share, int experts) {
  const double t = std::min(1.0, share * experts / 2.0);
  const int g = static_cast<int>(std::lround(255 * (1 - t)));
  const int r = static_cast<int>(std::lround(255 - 100 * std::max(0.0, t - 0.5) * 2));
  return absl::StrFormat("rgb(%d,%d,%d)", r, g, g);
}

std::string html_report(const std::string& title, const std::vector<BalanceSummary>& layers,
                        const BalanceSummary& overall) {
  const int experts = static_cast<int>(overall.share.size());
  constexpr int kCell = 28, kLeft = 70, kTop = 24;
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", title,
      "</title><style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
      "</style></head><body>\n<h1>", title, "</h1>\n<h2>Share of assignments per expert</h2>\n");
  const int width = kLeft + experts * kCell + 10;
  const int height = kTop + static_cast<int>(layers.size()) * kCell + 10;
  absl::StrAppend(&html, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width,
                  "\" height=\"", height, "\" font-size=\"11\">\n");
  for (int e = 0; e < experts; ++e)
    absl::StrAppend(&html, "<text x=\"", kLeft + e * kCell + kCell / 2, "\" y=\"", kTop - 8,
                    "\" text-anchor=\"middle\">", e, "</text>\n");
  for (size_t l = 0; l < layers.size(); ++l) {
    const int y = kTop + static_cast<int>(l) * kCell;
    absl::StrAppend(&html, "<text x=\"4\" y=\"", y + kCell / 2 + 4, "\">layer ", l, "</text>\n");
    for (int e = 0; e < experts; ++e)
      absl::StrAppend(&html, "<rect x=\"", kLeft + e * kCell, "\" y=\"", y, "\" width=\"", kCell,
                      "\" height=\"", kCell, "\" fill=\"", share_color(layers[l].share[e], experts),
                      "\" stroke=\"#ccc\"><title>layer ", l, " expert ", e, ": ",
                      absl::StrFormat("%.2f%%", 100 * layers[l].share[e]), "</title></rect>\n");
  }
  absl::StrAppend(&html, "</svg>\n<h2>Statistics</h2>\n<table><tr><th>layer</th><th>max/mean</th>"
                         "<th>cv</th><th>entropy</th><th>aux</th><th>z</th>");
  for (double cf : kBalanceCapacityFactors)
    absl::StrAppend(&html, "<th>dropped @", factor_name(cf), "</th>");
  absl::StrAppend(&html, "</tr>\n");
  auto row = [&](const std::string& name, const BalanceSummary& s) {
    absl::StrAppend(&html, "<tr><td>", name, "</td>",
                    absl::StrFormat("<td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.4f</td>"
                                    "<td>%.4f</td>",
                                    s.imbalance, s.cv, s.entropy, s.aux_loss, s.z_loss));
    for (double d : s.dropped) absl::StrAppend(&html, absl::StrFormat("<td>%.2f%%</td>", 100 * d));
    absl::StrAppend(&html, "</tr>\n");
  };
  for (size_t l = 0; l < layers.size(); ++l) row(absl::StrCat(l), layers[l]);
  row("overall", overall);
  absl::StrAppend(&html, "</table>\n");
  if (overall.has_all_to_all) {
    const AllToAllStats& a = overall.all_to_all;
    const int64_t max_bytes = std::max(
        std::max<int64_t>(1, *std::max_element(a.sent_bytes.begin(), a.sent_bytes.end())),
        *std::max_element(a.received_bytes.begin(), a.received_bytes.end()));
    constexpr int kBar = 300, kRow = 18;
    const int ranks = static_cast<int>(a.sent_bytes.size());
    absl::StrAppend(&html, "<h2>All-to-all bytes per rank (sent, received)</h2>\n",
                    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", kLeft + kBar + 120,
                    "\" height=\"", ranks * 2 * kRow + 10, "\" font-size=\"11\">\n");
    for (int p = 0; p < ranks; ++p) {
      const int64_t bytes[2] = {a.sent_bytes[p], a.received_bytes[p]};
      for (int d = 0; d < 2; ++d) {
        const int y = (2 * p + d) * kRow;
        const int w = static_cast<int>(kBar * bytes[d] / max_bytes);
        absl::StrAppend(&html, "<text x=\"4\" y=\"", y + 13, "\">rank ", p, d ? " recv" : " sent",
                        "</text><rect x=\"", kLeft, "\" y=\"", y + 2, "\" width=\"", w,
                        "\" height=\"", kRow - 4, "\" fill=\"", d ? "#4a7" : "#47a",
                        "\"/><text x=\"", kLeft + w + 4, "\" y=\"", y + 13, "\">",
                        absl::StrFormat("%.3f MB", bytes[d] / 1e6), "</text>\n");
      }
    }
    absl::StrAppend(&html, "</svg>\n");
  }
  absl::StrAppend(&html, "</body></html>\n");
  return html;
}

absl::Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace

BenchCommand::BenchCommand(CLI::App& app) {
  bench_ = app.add_subcommand("bench", "measure a model");
  bench_->require_subcommand(1);
  balance_ = bench_->add_subcommand("balance", "expert load balance of a model's routing");
  balance_->add_option("source", source_, "recipe file or weights directory")->required();
  balance_->add_option("--data", data_, "dataset directory (default: the recipe's data)");
  balance_->add_option("--synthetic", synthetic_, "synthetic tokens instead: zipf:S");
  balance_->add_option("--batches", batches_, "batches of micro_batch_size x seq_len tokens");
  balance_->add_option("--ep", ep_, "expert-parallel size for the all-to-all (1: skip)");
  balance_->add_option("--json", json_path_, "write the statistics as JSON");
  balance_->add_option("--report", report_path_, "write a self-contained HTML report");
}

bool BenchCommand::parsed() const { return bench_->parsed(); }

absl::Status BenchCommand::run() {
  if (balance_->parsed()) return run_balance();
  return absl::InvalidArgumentError("bench: unknown command");
}

absl::Status BenchCommand::run_balance() {
  if (batches_ < 1) return absl::InvalidArgumentError("--batches must be at least 1");
  if (!synthetic_.empty()) SY_RETURN_IF_ERROR(parse_zipf(synthetic_).status());
  BenchModel bm;
  SY_RETURN_IF_ERROR(load_bench_model(source_, bm));
  const config::Recipe& recipe = bm.recipe;
  const int experts = recipe.moe().num_experts();
  if (ep_ < 1 || experts % ep_ != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--ep ", ep_, " must divide moe.num_experts (", experts, ")"));
  SY_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> source,
                      make_source(recipe, data_, synthetic_));

  const int64_t batch = recipe.train().micro_batch_size();
  const int64_t seq = recipe.train().seq_len();
  Tensor ids = Tensor::empty({batch, seq}, DType::kI32);
  Tensor targets = Tensor::empty({batch, seq}, DType::kI32);
  const std::vector<const MoeLayer*> moe_layers = bm.model->moe_layers();
  std::vector<BalanceCounts> counts(moe_layers.size(),
                                    make_balance_counts(experts, recipe.moe().top_k(), ep_));
  Rng rng(recipe.train().seed());
  for (int64_t b = 0; b < batches_; ++b) {
    SY_RETURN_IF_ERROR(source->next(batch, seq, ids.data<int32_t>(), targets.data<int32_t>()));
    bm.model->forward(cpu_device(), ids, targets, /*training=*/false, rng);
    for (size_t l = 0; l < moe_layers.size(); ++l)
      add_routing(to_sample(moe_layers[l]->last_routing()), counts[l]);
  }

  const int64_t hidden = recipe.model().hidden_size();
  std::vector<BalanceSummary> layers;
  for (const BalanceCounts& c : counts) layers.push_back(summarize_balance(c, hidden));
  const BalanceSummary overall = summarize_overall(counts, hidden);
  std::printf("bench balance: %s, %lld batches of %lld x %lld tokens, %d experts top-%d\n",
              recipe.name().c_str(), static_cast<long long>(batches_),
              static_cast<long long>(batch), static_cast<long long>(seq), experts,
              recipe.moe().top_k());
  print_table(layers, overall);

  if (!json_path_.empty()) {
    nlohmann::ordered_json j;
    j["recipe"] = recipe.name();
    j["batches"] = batches_;
    j["tokens_per_batch"] = batch * seq;
    j["expert_parallel"] = ep_;
    j["layers"] = nlohmann::ordered_json::array();
    for (const BalanceSummary& s : layers) j["layers"].push_back(to_json(s));
    j["overall"] = to_json(overall);
    SY_RETURN_IF_ERROR(write_file(json_path_, j.dump(2) + "\n"));
  }
  if (!report_path_.empty())
    SY_RETURN_IF_ERROR(write_file(
        report_path_, html_report(absl::StrCat("Expert load balance: ", recipe.name()), layers,
                                  overall)));
  return absl::OkStatus();
}

}  // namespace switchyard
