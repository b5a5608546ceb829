#include "engine/cli/bench_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/config/recipe.h"
#include "core/runtime/file_util.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "data/corpus_cache.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "engine/cli/load_model.h"
#include "engine/cli/number_flags.h"
#include "engine/model/transformer.h"
#include "engine/train/balance_history.h"
#include "engine/train/metrics_log.h"
#include "kernels/threads.h"
#include "moe/balance_stats.h"
#include "moe/replica_plan.h"

namespace switchyard {

namespace {

namespace fs = std::filesystem;

// What `bench balance` measures: a recipe file's model at its seeded initialisation, or
// the weights of a directory load_model reads (its recipe and tokenizer with them).
struct BenchSource {
  config::Recipe recipe;
  std::unique_ptr<LoadedModel> weights;  // null for a recipe file
};

absl::StatusOr<BenchSource> load_source(const std::string& source,
                                        const std::vector<std::string>& overrides) {
  std::error_code ec;
  BenchSource out;
  if (is_model_directory(source)) {
    if (!overrides.empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "--set overrides a recipe file; ", source, " holds weights of its own shape"));
    out.weights = std::make_unique<LoadedModel>();
    SY_RETURN_IF_ERROR(load_model(source, *out.weights));
    out.recipe = out.weights->recipe;
  } else if (fs::is_regular_file(source, ec)) {
    SY_ASSIGN_OR_RETURN(out.recipe, config::load_recipe(source, overrides));
  } else {
    return absl::NotFoundError(absl::StrCat(
        source, ": no such recipe file, weights directory, checkpoint or Hugging Face directory"));
  }
  if (out.recipe.moe().num_experts() <= 0)
    return absl::InvalidArgumentError(absl::StrCat(source, ": the model has no MoE layers"));
  return out;
}

// A model of `recipe` (whose routing settings may differ from the source's) with the
// source's weights: the loaded ones, or a recipe's seeded initialisation, as training
// starts from it. Routing settings do not change any parameter's shape, so every variant
// gets the same weights.
struct BenchModel {
  ParamStore params;
  std::unique_ptr<Transformer> model;
};

absl::Status build_bench_model(const config::Recipe& recipe, const std::string& source,
                               const LoadedModel* weights, BenchModel& out) {
  out.model = std::make_unique<Transformer>(recipe, out.params);
  SY_RETURN_IF_ERROR(check_fits(cpu_device(),
                                static_cast<double>(out.params.allocation_bytes(DType::kF32)),
                                absl::StrCat("the parameters of ", source)));
  out.params.allocate(cpu_device());
  if (weights == nullptr) {
    out.params.initialize(recipe.train().seed());
    return absl::OkStatus();
  }
  // By name: a parameter that only one routing has (the sigmoid router's bias, which no
  // gradient trains) keeps its initial value in a variant that adds it, and is unused in
  // one that drops it; every trained parameter must be the weights'.
  std::map<std::string, const Param*> loaded;
  for (const Param& p : weights->params.params()) loaded[p.name] = &p;
  for (Param& p : out.params.params()) {
    const auto it = loaded.find(p.name);
    if (it == loaded.end() && !p.trainable) continue;
    if (it == loaded.end() || it->second->shape != p.shape)
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the compared variant's parameter ", p.name, " is not the weights'"));
    p.value.copy_from(it->second->value);
    loaded.erase(it);
  }
  for (const auto& [name, p] : loaded)
    if (p->trainable)
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the weights' parameter ", name, " has no place in the variant"));
  return absl::OkStatus();
}

// One routing configuration measured on the shared tokens.
struct Variant {
  std::string name;  // "top_k=2", "renormalize=false"; empty without --compare
  config::Recipe recipe;
};

// The values an enum setting of the recipe schema takes, in its order ("TOP_K", ...).
std::vector<std::string> enum_names(const google::protobuf::EnumDescriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.value_count(); ++i)
    if (type.value(i)->number() != 0) names.push_back(std::string(type.value(i)->name()));
  return names;
}

// The routing settings --compare varies: the enums take "all" too.
const google::protobuf::EnumDescriptor* enum_setting(absl::string_view key) {
  if (key == "gating") return config::Gating_descriptor();
  if (key == "score_function") return config::ScoreFunction_descriptor();
  return nullptr;
}

// `base` routing with moe.`key`=`value`: the settings that the new routing does not read
// are cleared (GShard's and expert choice's score function, fixed for them; with softmax
// scores the sigmoid router's), the aux loss too where sigmoid scores refuse one (nothing
// is trained here: it only weights a training loss), and the defaults are filled for the
// new routing, as loading a recipe that named it would. A new gating or score function
// renormalises as it does by default.
absl::Status set_routing(const std::string& key, const std::string& value,
                         config::Recipe& recipe) {
  SY_RETURN_IF_ERROR(config::apply_override(recipe, absl::StrCat("moe.", key, "=", value)));
  config::MoeConfig& moe = *recipe.mutable_moe();
  if (key != "renormalize") moe.clear_renormalize();
  if (key == "gating" && moe.gating() != config::TOP_K) moe.clear_score_function();
  if (moe.score_function() == config::SIGMOID) {
    moe.set_aux_loss_coef(0);
  } else {
    moe.clear_routed_scaling_factor();
    moe.clear_bias_update_rate();
    moe.clear_num_groups();
    moe.clear_top_groups();
  }
  config::fill_defaults(recipe);
  return absl::OkStatus();
}

// "top_k=1,2,4", "gating=TOP_K,GSHARD_TOP2", "score_function=SOFTMAX,SIGMOID" or
// "renormalize=true,false" (a "moe." prefix is accepted, enum names in any case, "all" for
// every one of an enum) -> one validated recipe per value.
absl::StatusOr<std::vector<Variant>> parse_compare(const std::string& spec,
                                                   const config::Recipe& base) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--compare ", spec, ": ", why,
        " (expected top_k=K1,K2,..., gating=NAME1,NAME2,... with NAME one of ",
        absl::StrJoin(enum_names(*config::Gating_descriptor()), ", "),
        ", score_function=NAME1,NAME2,... with NAME one of ",
        absl::StrJoin(enum_names(*config::ScoreFunction_descriptor()), ", "),
        ", either of them =all, or renormalize=true,false)"));
  };
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) return bad("no '='");
  std::string key(absl::StripAsciiWhitespace(spec.substr(0, eq)));
  if (absl::StartsWith(key, "moe.")) key = key.substr(4);
  const google::protobuf::EnumDescriptor* names = enum_setting(key);
  if (key != "top_k" && key != "renormalize" && names == nullptr)
    return bad(absl::StrCat("unknown setting '", key, "'"));
  std::vector<std::string> values;
  for (absl::string_view piece : absl::StrSplit(spec.substr(eq + 1), ','))
    values.emplace_back(absl::StripAsciiWhitespace(piece));
  if (names != nullptr) {
    for (std::string& value : values) absl::AsciiStrToUpper(&value);
    if (values == std::vector<std::string>{"ALL"}) values = enum_names(*names);
  }
  std::vector<Variant> variants;
  for (const std::string& value : values) {
    if (value.empty()) return bad("empty value");
    Variant v{absl::StrCat(key, "=", value), base};
    for (const Variant& seen : variants)
      if (seen.name == v.name) return bad(absl::StrCat(value, " is listed twice"));
    absl::Status status = key == "top_k"
                              ? config::apply_override(v.recipe, absl::StrCat("moe.top_k=", value))
                              : set_routing(key, value, v.recipe);
    if (status.ok()) status = config::validate_recipe(v.recipe);
    if (!status.ok()) return bad(status.message());
    variants.push_back(std::move(v));
  }
  return variants;
}

// Zipf exponents above 64 give every token but the first a probability below 2^-64:
// every draw is the same token, which measures nothing more.
constexpr double kMaxZipfExponent = 64;

// "zipf:S" with S in (0, 64] -> S.
absl::StatusOr<double> parse_zipf(const std::string& spec) {
  if (spec.rfind("zipf:", 0) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--synthetic: ", spec, " is not zipf:S, S the exponent"));
  return parse_double(absl::string_view(spec).substr(5), "--synthetic zipf:S",
                      {0, kMaxZipfExponent, /*min_open=*/true});
}

// Fills (batch, seq) ids and targets, batch after batch.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual absl::Status next(int64_t batch, int64_t seq, int32_t* ids, int32_t* targets) = 0;
  // With padded windows (data.packing PAD), the positions of each window of the last
  // next() that hold text, from the first (Transformer::forward's window_tokens); else
  // empty.
  virtual std::vector<int32_t> window_tokens() const { return {}; }
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

// Consecutive windows of the train split, wrapping around: packed, or with data.packing
// PAD one document each, padded.
class DatasetSource : public TokenSource {
 public:
  explicit DatasetSource(TokenDataset dataset) : dataset_(std::move(dataset)) {}
  absl::Status next(int64_t batch, int64_t seq, int32_t* ids, int32_t* targets) override {
    const int64_t windows = dataset_.num_windows(seq);
    if (windows == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "the train split is shorter than one window of ", seq + 1, " tokens"));
    window_tokens_.clear();
    for (int64_t b = 0; b < batch; ++b, ++window_) {
      SY_RETURN_IF_ERROR(
          dataset_.read_window(window_ % windows, seq, ids + b * seq, targets + b * seq));
      if (dataset_.pads_documents())
        window_tokens_.push_back(
            static_cast<int32_t>(dataset_.window_tokens(window_ % windows, seq)));
    }
    return absl::OkStatus();
  }
  std::vector<int32_t> window_tokens() const override { return window_tokens_; }

 private:
  TokenDataset dataset_;
  int64_t window_ = 0;
  std::vector<int32_t> window_tokens_;
};

class PrintMessages : public DataProgressSink {
 public:
  void on_message(const std::string& text) override {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
};

// Tokens for the model of `source`: synthetic ones, or a dataset's, which must be
// tokenised with a weights directory's own tokenizer and fit the model's vocabulary.
absl::StatusOr<std::unique_ptr<TokenSource>> make_source(const config::Recipe& recipe,
                                                         const std::string& source,
                                                         const LoadedModel* weights,
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
  DatasetOpenOptions open_options;
  open_options.pad_documents = recipe.data().packing() == config::PAD;
  if (weights) {
    open_options.expected_tokenizer_sha256 = weights->tokenizer->sha256();
    open_options.expected_vocab_size = weights->tokenizer->vocab_size();
  }
  SY_ASSIGN_OR_RETURN(TokenDataset dataset, TokenDataset::open(dir, "train", open_options));
  if (dataset.vocab_size() > recipe.model().vocab_size())
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": its tokenizer has ", dataset.vocab_size(), " tokens, more than model.vocab_size (",
        recipe.model().vocab_size(), ") of ", source));
  return std::make_unique<DatasetSource>(std::move(dataset));
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

// Replica slots under expert parallelism: each MoE layer's plan from its own tokens per
// expert (a layer's experts are its own weights, so every layer has its K slots per rank),
// and the rows of every batch dispatched without and with it, per layer. A rank's load is
// the rows its expert copies take (the placement advice's assignments), all layers
// together.
struct ReplicaRun {
  int slots_per_rank = 0;
  std::vector<std::vector<std::vector<int>>> replicas;  // per layer, per rank: the experts
  std::vector<DispatchRows> without, with;              // per layer
  DispatchRows all_without, all_with;                   // all layers together
};

// The statistics of one variant: per MoE layer in depth order, and all layers together.
// With expert parallelism, the placement advice from all layers' tokens per expert
// together (one placement serves every layer), and with replica slots their plans.
struct BalanceRun {
  std::vector<BalanceSummary> layers;
  BalanceSummary overall;
  std::optional<PlacementAdvice> placement;
  std::optional<ReplicaRun> replicas;
};

int64_t sum_of(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// "busiest rank 1.534 x the mean without, 1.062 x with; rows sent to other ranks 81234
// without, 80112 with (-1.4%)".
std::string replica_figures(const DispatchRows& without, const DispatchRows& with) {
  const int64_t sent = sum_of(without.sent), sent_with = sum_of(with.sent);
  const double change =
      sent > 0 ? 100.0 * (static_cast<double>(sent_with) / static_cast<double>(sent) - 1.0) : 0.0;
  return absl::StrFormat("busiest rank %.3f x the mean without, %.3f x with; rows sent to other "
                         "ranks %lld without, %lld with (%+.1f%%)",
                         max_over_mean(without.rank_tokens), max_over_mean(with.rank_tokens),
                         static_cast<long long>(sent), static_cast<long long>(sent_with), change);
}

// Each rank's replicated experts: "[5] [0] [] ...".
std::string replica_list(const std::vector<std::vector<int>>& replicas) {
  std::vector<std::string> ranks;
  for (const std::vector<int>& experts : replicas)
    ranks.push_back(absl::StrCat("[", absl::StrJoin(experts, ", "), "]"));
  return absl::StrJoin(ranks, " ");
}

void print_replicas(const ReplicaRun& r, int variant_width) {
  auto indent = [&] {
    if (variant_width > 0) std::printf("%-*s ", variant_width, "");
  };
  indent();
  std::printf("replicas, %d slot%s per rank in each layer, all layers: %s\n", r.slots_per_rank,
              r.slots_per_rank == 1 ? "" : "s",
              replica_figures(r.all_without, r.all_with).c_str());
  for (size_t l = 0; l < r.replicas.size(); ++l) {
    indent();
    std::printf("  layer %zu: %s; replicated by rank: %s\n", l,
                replica_figures(r.without[l], r.with[l]).c_str(),
                replica_list(r.replicas[l]).c_str());
  }
}

// "busiest rank 1234 assignments contiguous, 1100 advised (-10.9%), >= 1090 for any
// placement": a rank's load is the routed assignments its experts take.
std::string placement_line(const PlacementAdvice& a) {
  const double change = a.contiguous_max > 0 ? 100.0 * (static_cast<double>(a.advised_max) /
                                                            static_cast<double>(a.contiguous_max) -
                                                        1.0)
                                             : 0.0;
  return absl::StrFormat("busiest rank %lld assignments contiguous, %lld advised (%+.1f%%), "
                         ">= %lld for any placement; parallel.expert_placement: [%s]",
                         static_cast<long long>(a.contiguous_max),
                         static_cast<long long>(a.advised_max), change,
                         static_cast<long long>(a.lower_bound), absl::StrJoin(a.placement, ", "));
}

// The variant's first table column: its name on the block's first row, blank below.
void print_row(const std::string& variant, int variant_width, const std::string& layer,
               const BalanceSummary& s) {
  if (variant_width > 0) std::printf("%-*s ", variant_width, variant.c_str());
  std::printf("%-8s %9.3f %7.3f %8.3f %6.1f%%", layer.c_str(), s.imbalance, s.cv, s.entropy,
              100.0 * s.entropy_fraction);
  for (double d : s.dropped) std::printf(" %7.2f%%", 100.0 * d);
  std::printf(" %8.4f %8.4f", s.aux_loss, s.z_loss);
  if (s.has_all_to_all) std::printf(" %8.3f", s.all_to_all.imbalance);
  std::printf("\n");
}

// One block of rows per variant (a single block without --compare, and no variant column).
void print_table(const std::vector<Variant>& variants, const std::vector<BalanceRun>& runs) {
  int variant_width = 0;
  for (const Variant& v : variants)
    variant_width = std::max(variant_width, static_cast<int>(v.name.size()));
  if (variant_width > 0) {
    variant_width = std::max(variant_width, 7);
    std::printf("%-*s ", variant_width, "variant");
  }
  std::printf("%-8s %9s %7s %8s %7s", "layer", "max/mean", "cv", "entropy", "of lnE");
  for (double cf : kBalanceCapacityFactors)
    std::printf(" %8s", absl::StrCat("drop@", factor_name(cf)).c_str());
  std::printf(" %8s %8s", "aux", "z");
  if (runs[0].overall.has_all_to_all) std::printf(" %8s", "a2a max");
  std::printf("\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    const BalanceRun& run = runs[i];
    for (size_t l = 0; l < run.layers.size(); ++l)
      print_row(l == 0 ? variants[i].name : "", variant_width, absl::StrCat(l), run.layers[l]);
    print_row(run.layers.empty() ? variants[i].name : "", variant_width, "overall", run.overall);
    if (run.overall.has_all_to_all) {
      const AllToAllStats& a = run.overall.all_to_all;
      for (size_t p = 0; p < a.sent_bytes.size(); ++p) {
        if (variant_width > 0) std::printf("%-*s ", variant_width, "");
        std::printf("rank %zu: sent %.3f MB, received %.3f MB, %lld assignments (advised "
                    "placement: %lld)\n",
                    p, a.sent_bytes[p] / 1e6, a.received_bytes[p] / 1e6,
                    static_cast<long long>(run.placement->contiguous_loads[p]),
                    static_cast<long long>(run.placement->advised_loads[p]));
      }
      if (variant_width > 0) std::printf("%-*s ", variant_width, "");
      std::printf("%s\n", placement_line(*run.placement).c_str());
    }
    if (run.replicas) print_replicas(*run.replicas, variant_width);
  }
}

// The figures of one layer, or of all layers together, without and with replicas.
void put_replica_figures(nlohmann::ordered_json& into, const DispatchRows& without,
                         const DispatchRows& with) {
  into["ep_rank_max_over_mean"] = max_over_mean(without.rank_tokens);
  into["ep_rank_max_over_mean_replicated"] = max_over_mean(with.rank_tokens);
  into["rank_tokens"] = without.rank_tokens;
  into["rank_tokens_replicated"] = with.rank_tokens;
  into["exchange_rows"] = sum_of(without.sent);
  into["exchange_rows_replicated"] = sum_of(with.sent);
}

// The run's ep_rank_max_over_mean_replicated beside its ep_rank_max_over_mean, and
// `replicas`: the slots, the figures of all layers and of each with its replicated experts.
void put_replicas(nlohmann::ordered_json& into, const ReplicaRun& r) {
  into["ep_rank_max_over_mean_replicated"] = max_over_mean(r.all_with.rank_tokens);
  nlohmann::ordered_json replicas = {{"slots_per_rank", r.slots_per_rank}};
  put_replica_figures(replicas, r.all_without, r.all_with);
  replicas["layers"] = nlohmann::ordered_json::array();
  for (size_t l = 0; l < r.replicas.size(); ++l) {
    nlohmann::ordered_json layer = {{"replicated_experts", r.replicas[l]}};
    put_replica_figures(layer, r.without[l], r.with[l]);
    replicas["layers"].push_back(std::move(layer));
  }
  into["replicas"] = std::move(replicas);
}

std::string html_escape(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string css_color(double share, int experts) {
  const Rgb c = load_color(share, experts);
  return absl::StrFormat("rgb(%d,%d,%d)", c.r, c.g, c.b);
}

// A layers x experts heatmap of the shares.
std::string heatmap_svg(const std::vector<BalanceSummary>& layers) {
  const int experts = layers.empty() ? 0 : static_cast<int>(layers[0].share.size());
  constexpr int kCell = 28, kLeft = 70, kTop = 24;
  const int width = kLeft + experts * kCell + 10;
  const int height = kTop + static_cast<int>(layers.size()) * kCell + 10;
  std::string svg = absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width,
                                 "\" height=\"", height, "\" font-size=\"11\">\n");
  for (int e = 0; e < experts; ++e)
    absl::StrAppend(&svg, "<text x=\"", kLeft + e * kCell + kCell / 2, "\" y=\"", kTop - 8,
                    "\" text-anchor=\"middle\">", e, "</text>\n");
  for (size_t l = 0; l < layers.size(); ++l) {
    const int y = kTop + static_cast<int>(l) * kCell;
    absl::StrAppend(&svg, "<text x=\"4\" y=\"", y + kCell / 2 + 4, "\">layer ", l, "</text>\n");
    for (int e = 0; e < experts; ++e)
      absl::StrAppend(&svg, "<rect x=\"", kLeft + e * kCell, "\" y=\"", y, "\" width=\"", kCell,
                      "\" height=\"", kCell, "\" fill=\"", css_color(layers[l].share[e], experts),
                      "\" stroke=\"#ccc\"><title>layer ", l, " expert ", e, ": ",
                      absl::StrFormat("%.2f%%", 100 * layers[l].share[e]), "</title></rect>\n");
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

// The heatmap's colour scale under its key: load_color is linear in each channel between
// no load, the uniform share and twice it, so a three-stop gradient draws it exactly.
std::string legend_svg(int experts) {
  constexpr int kLeft = 70, kWidth = 300;
  const std::pair<double, std::string> stops[] = {
      {0.0, "0"},
      {0.5, absl::StrFormat("1/E = %.1f%% (uniform)", 100.0 / experts)},
      {1.0, absl::StrFormat(">= 2/E = %.1f%%", 200.0 / experts)}};
  std::string svg = absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                                 kLeft + kWidth + 60, "\" height=\"44\" font-size=\"11\">\n"
                                 "<defs><linearGradient id=\"load-scale\">");
  for (const auto& [at, label] : stops)
    absl::StrAppend(&svg, "<stop offset=\"", at, "\" stop-color=\"",
                    css_color(at * 2.0 / experts, experts), "\"/>");
  absl::StrAppend(&svg, "</linearGradient></defs>\n<text x=\"4\" y=\"16\">share</text>"
                  "<rect x=\"", kLeft, "\" y=\"4\" width=\"", kWidth, "\" height=\"16\" "
                  "fill=\"url(#load-scale)\" stroke=\"#ccc\"/>\n");
  for (const auto& [at, label] : stops)
    absl::StrAppend(&svg, "<text x=\"", kLeft + static_cast<int>(at * kWidth), "\" y=\"36\" "
                    "text-anchor=\"middle\">", html_escape(label), "</text>\n");
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

// Bars of the assignments each expert-parallel rank's experts take, under the contiguous and
// the advised placement.
std::string rank_load_svg(const PlacementAdvice& a) {
  const int64_t max_load = std::max<int64_t>(1, std::max(a.contiguous_max, a.advised_max));
  constexpr int kLeft = 110, kBar = 300, kRow = 18;
  const int ranks = static_cast<int>(a.contiguous_loads.size());
  std::string svg = absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                                 kLeft + kBar + 120, "\" height=\"", ranks * 2 * kRow + 10,
                                 "\" font-size=\"11\">\n");
  for (int p = 0; p < ranks; ++p) {
    const int64_t load[2] = {a.contiguous_loads[p], a.advised_loads[p]};
    for (int d = 0; d < 2; ++d) {
      const int y = (2 * p + d) * kRow;
      const int w = static_cast<int>(kBar * load[d] / max_load);
      absl::StrAppend(&svg, "<text x=\"4\" y=\"", y + 13, "\">rank ", p,
                      d ? " advised" : " contiguous", "</text><rect x=\"", kLeft, "\" y=\"",
                      y + 2, "\" width=\"", w, "\" height=\"", kRow - 4, "\" fill=\"",
                      d ? "#4a7" : "#47a", "\"/><text x=\"", kLeft + w + 4, "\" y=\"", y + 13,
                      "\">", load[d], " assignments</text>\n");
    }
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

// Bars of the bytes each rank sends and receives.
std::string all_to_all_svg(const AllToAllStats& a) {
  const int64_t max_bytes = std::max(
      std::max<int64_t>(1, *std::max_element(a.sent_bytes.begin(), a.sent_bytes.end())),
      *std::max_element(a.received_bytes.begin(), a.received_bytes.end()));
  constexpr int kLeft = 70, kBar = 300, kRow = 18;
  const int ranks = static_cast<int>(a.sent_bytes.size());
  std::string svg = absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                                 kLeft + kBar + 120, "\" height=\"", ranks * 2 * kRow + 10,
                                 "\" font-size=\"11\">\n");
  for (int p = 0; p < ranks; ++p) {
    const int64_t bytes[2] = {a.sent_bytes[p], a.received_bytes[p]};
    for (int d = 0; d < 2; ++d) {
      const int y = (2 * p + d) * kRow;
      const int w = static_cast<int>(kBar * bytes[d] / max_bytes);
      absl::StrAppend(&svg, "<text x=\"4\" y=\"", y + 13, "\">rank ", p, d ? " recv" : " sent",
                      "</text><rect x=\"", kLeft, "\" y=\"", y + 2, "\" width=\"", w,
                      "\" height=\"", kRow - 4, "\" fill=\"", d ? "#4a7" : "#47a",
                      "\"/><text x=\"", kLeft + w + 4, "\" y=\"", y + 13, "\">",
                      absl::StrFormat("%.3f MB", bytes[d] / 1e6), "</text>\n");
    }
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

// Each layer's max/mean tokens per expert over a training run, one line per layer on
// shared axes (steps across, imbalance up from 1), each line's colour named in a key.
std::string history_svg(const ImbalanceHistory& h) {
  constexpr int kLeft = 50, kTop = 10, kWidth = 480, kHeight = 200, kKeyRow = 16;
  static constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                            "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
  const auto [lo, hi] = std::minmax_element(h.steps.begin(), h.steps.end());
  const double steps = std::max<double>(1, static_cast<double>(*hi - *lo));
  double top = 1.0;
  for (const std::vector<double>& layer : h.layers)
    top = std::max(top, *std::max_element(layer.begin(), layer.end()));
  const double span = std::max(top - 1.0, 1e-9);
  auto x = [&](int64_t step) { return kLeft + kWidth * static_cast<double>(step - *lo) / steps; };
  auto y = [&](double v) { return kTop + kHeight * (1.0 - (std::max(v, 1.0) - 1.0) / span); };
  const int layers = static_cast<int>(h.layers.size());
  std::string svg = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", kLeft + kWidth + 20, "\" height=\"",
      kTop + kHeight + 30 + layers * kKeyRow, "\" font-size=\"11\">\n<rect x=\"", kLeft,
      "\" y=\"", kTop, "\" width=\"", kWidth, "\" height=\"", kHeight,
      "\" fill=\"none\" stroke=\"#999\"/>\n",
      absl::StrFormat("<text x=\"4\" y=\"%d\">%.2f</text><text x=\"4\" y=\"%d\">1.00</text>"
                      "<text x=\"%d\" y=\"%d\">step %lld</text>"
                      "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">step %lld</text>\n",
                      kTop + 10, top, kTop + kHeight, kLeft, kTop + kHeight + 14,
                      static_cast<long long>(*lo), kLeft + kWidth, kTop + kHeight + 14,
                      static_cast<long long>(*hi)));
  for (int l = 0; l < layers; ++l) {
    const char* color = kColors[l % std::size(kColors)];
    std::string points;
    for (size_t i = 0; i < h.steps.size(); ++i)
      absl::StrAppend(&points, absl::StrFormat("%.1f,%.1f ", x(h.steps[i]), y(h.layers[l][i])));
    const int key_y = kTop + kHeight + 30 + l * kKeyRow;
    absl::StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", color, "\" points=\"", points,
                    "\"/>\n<rect x=\"", kLeft, "\" y=\"", key_y - 9, "\" width=\"20\" height=\"3\" "
                    "fill=\"", color, "\"/><text x=\"", kLeft + 26, "\" y=\"", key_y, "\">layer ", l,
                    absl::StrFormat(": %.2f at step %lld, %.2f at step %lld", h.layers[l].front(),
                                    static_cast<long long>(h.steps.front()), h.layers[l].back(),
                                    static_cast<long long>(h.steps.back())),
                    "</text>\n");
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

// One figure per variant, side by side (wrapping on narrow windows); a single figure
// without a caption when there are no variants to compare.
std::string side_by_side(const std::vector<Variant>& variants,
                         const std::vector<std::string>& figures) {
  if (variants[0].name.empty()) return figures[0];
  std::string html = "<div class=\"variants\">\n";
  for (size_t i = 0; i < figures.size(); ++i)
    absl::StrAppend(&html, "<figure><figcaption>", html_escape(variants[i].name),
                    "</figcaption>\n", figures[i], "</figure>\n");
  absl::StrAppend(&html, "</div>\n");
  return html;
}

// How a report begins, up to its title: an existing file that begins so is a report that
// --overwrite may replace.
constexpr char kReportHead[] = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>";
constexpr char kReportTitle[] = "Expert load balance: ";

// A self-contained page (no scripts, no external resources) in three sections: the
// heatmaps, the statistics (a block of rows per variant, as on the terminal) and, with
// expert parallelism, the all-to-all bytes.
std::string html_report(const std::string& title, const std::vector<Variant>& variants,
                        const std::vector<BalanceRun>& runs,
                        const std::optional<ImbalanceHistory>& history) {
  const bool compare = !variants[0].name.empty();
  std::string html = absl::StrCat(
      kReportHead, html_escape(title),
      "</title><style>body{font-family:sans-serif}table{border-collapse:collapse}"
      "td,th{padding:2px 8px;text-align:right}"
      ".variants{display:flex;flex-wrap:wrap;gap:8px 32px;align-items:flex-start}"
      "figure{margin:0}figcaption{font-weight:bold;margin:4px 0}"
      "tr.first td{border-top:1px solid #999}</style></head><body>\n<h1>",
      html_escape(title), "</h1>\n");

  std::vector<std::string> figures;
  for (const BalanceRun& run : runs) figures.push_back(heatmap_svg(run.layers));
  absl::StrAppend(&html, "<section>\n<h2>Share of assignments per expert</h2>\n",
                  legend_svg(static_cast<int>(runs[0].overall.share.size())),
                  side_by_side(variants, figures), "</section>\n");

  absl::StrAppend(&html, "<section>\n<h2>Statistics</h2>\n<table><tr>",
                  compare ? "<th>variant</th>" : "",
                  "<th>layer</th><th>max/mean</th><th>cv</th><th>entropy</th><th>aux</th>"
                  "<th>z</th>");
  for (double cf : kBalanceCapacityFactors)
    absl::StrAppend(&html, "<th>dropped @", factor_name(cf), "</th>");
  absl::StrAppend(&html, "</tr>\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    auto row = [&](const std::string& layer, const BalanceSummary& s, bool first) {
      absl::StrAppend(&html, first && compare ? "<tr class=\"first\">" : "<tr>");
      if (compare)
        absl::StrAppend(&html, "<td>", first ? html_escape(variants[i].name) : "", "</td>");
      absl::StrAppend(&html, "<td>", layer, "</td>",
                      absl::StrFormat("<td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.4f</td>"
                                      "<td>%.4f</td>",
                                      s.imbalance, s.cv, s.entropy, s.aux_loss, s.z_loss));
      for (double d : s.dropped)
        absl::StrAppend(&html, absl::StrFormat("<td>%.2f%%</td>", 100 * d));
      absl::StrAppend(&html, "</tr>\n");
    };
    const BalanceRun& run = runs[i];
    for (size_t l = 0; l < run.layers.size(); ++l) row(absl::StrCat(l), run.layers[l], l == 0);
    row("overall", run.overall, run.layers.empty());
  }
  absl::StrAppend(&html, "</table>\n</section>\n");

  if (runs[0].overall.has_all_to_all) {
    figures.clear();
    for (const BalanceRun& run : runs) figures.push_back(all_to_all_svg(run.overall.all_to_all));
    absl::StrAppend(&html, "<section>\n<h2>All-to-all bytes per rank (sent, received)</h2>\n",
                    side_by_side(variants, figures), "</section>\n");
    figures.clear();
    for (const BalanceRun& run : runs) figures.push_back(rank_load_svg(*run.placement));
    absl::StrAppend(&html, "<section>\n<h2>Tokens per expert-parallel rank, all layers</h2>\n",
                    side_by_side(variants, figures));
    for (size_t i = 0; i < runs.size(); ++i)
      absl::StrAppend(&html, "<p>", compare ? html_escape(variants[i].name) + ": " : "",
                      html_escape(placement_line(*runs[i].placement)), "</p>\n");
    absl::StrAppend(&html, "</section>\n");
  }
  if (history)
    absl::StrAppend(&html, "<section>\n<h2>Max/mean tokens per expert over training, each "
                    "layer</h2>\n", history_svg(*history), "</section>\n");
  absl::StrAppend(&html, "</body></html>\n");
  return html;
}

// Each MoE layer's imbalance over the run in `run_dir`, from its metrics.jsonl.
absl::StatusOr<ImbalanceHistory> run_history(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    return absl::NotFoundError(absl::StrCat("--run-dir ", run_dir, ": no such directory"));
  SY_ASSIGN_OR_RETURN(const std::string path,
                      path_in_directory(run_dir, "metrics.jsonl", "--run-dir"));
  SY_ASSIGN_OR_RETURN(const std::string text, read_file(path, kMaxMetricsFileBytes));
  SY_ASSIGN_OR_RETURN(ImbalanceHistory history, read_imbalance_history(text, path));
  if (history.steps.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no line has layer_imbalance (a run of an MoE model logs it)"));
  return history;
}

// One batch of token ids and targets, (micro_batch, seq) i32 each, and with padded
// windows each window's text length, (micro_batch) i32 (TokenSource::window_tokens).
struct TokenBatch {
  Tensor ids, targets, window_tokens;
};

void add_rows(const DispatchRows& from, DispatchRows& into) {
  if (into.rank_tokens.empty()) {
    into = from;
    return;
  }
  for (size_t p = 0; p < from.rank_tokens.size(); ++p) {
    into.rank_tokens[p] += from.rank_tokens[p];
    into.sent[p] += from.sent[p];
    into.received[p] += from.received[p];
  }
}

// Each layer's replica plan from its tokens per expert over every batch, and each batch's
// dispatch (`by_source[l][b]`: assignments_by_source of layer l in batch b) without and
// with it, on the contiguous placement.
absl::StatusOr<ReplicaRun> measure_replicas(
    const std::vector<BalanceCounts>& counts,
    const std::vector<std::vector<std::vector<int64_t>>>& by_source, int ep, int slots) {
  ReplicaRun run;
  run.slots_per_rank = slots;
  for (size_t l = 0; l < counts.size(); ++l) {
    SY_ASSIGN_OR_RETURN(const ReplicaPlan plan, plan_replicas(counts[l].selections, {}, ep, slots));
    std::vector<int> contiguous(counts[l].selections.size());
    std::iota(contiguous.begin(), contiguous.end(), 0);
    const ReplicaPlan owners = owner_plan(contiguous, ep);
    DispatchRows without, with;
    for (const std::vector<int64_t>& batch : by_source[l]) {
      add_rows(dispatch_rows(owners, batch), without);
      add_rows(dispatch_rows(plan, batch), with);
    }
    add_rows(without, run.all_without);
    add_rows(with, run.all_with);
    run.without.push_back(std::move(without));
    run.with.push_back(std::move(with));
    run.replicas.push_back(plan.replicas);
  }
  return run;
}

// Routes every batch through the variant's model and gathers each MoE layer's counts;
// with `replica_slots`, each layer's replica plan too.
absl::StatusOr<BalanceRun> measure(const config::Recipe& recipe, const std::string& source,
                                   const LoadedModel* weights,
                                   const std::vector<TokenBatch>& batches, int ep,
                                   int replica_slots) {
  BenchModel bm;
  SY_RETURN_IF_ERROR(build_bench_model(recipe, source, weights, bm));
  const std::vector<const MoeLayer*> moe_layers = bm.model->moe_layers();
  const int experts = recipe.moe().num_experts();
  std::vector<BalanceCounts> counts(moe_layers.size(),
                                    make_balance_counts(experts, recipe.moe().top_k(), ep));
  std::vector<std::vector<std::vector<int64_t>>> by_source(moe_layers.size());
  if (replica_slots > 0)
    SY_RETURN_IF_ERROR(check_fits(cpu_device(),
                                  static_cast<double>(moe_layers.size()) * batches.size() * ep *
                                      experts * sizeof(int64_t),
                                  "the per-rank assignment counts of every layer and batch"));
  Rng rng(recipe.train().seed());
  for (const TokenBatch& b : batches) {
    bm.model->evaluate(cpu_device(), b.ids, b.targets, rng, /*logits_out=*/nullptr,
                       /*doc_starts=*/Tensor(), b.window_tokens);
    for (size_t l = 0; l < moe_layers.size(); ++l) {
      const RoutingSample sample = routing_sample(moe_layers[l]->last_routing());
      add_routing(sample, counts[l]);
      if (replica_slots > 0) by_source[l].push_back(assignments_by_source(sample, experts, ep));
    }
  }
  const int64_t hidden = recipe.model().hidden_size();
  BalanceRun run;
  for (const BalanceCounts& c : counts) run.layers.push_back(summarize_balance(c, hidden));
  run.overall = summarize_overall(counts, hidden);
  if (ep > 1) run.placement = advise_placement(run.overall.tokens_per_expert, ep);
  if (replica_slots > 0) {
    SY_ASSIGN_OR_RETURN(run.replicas, measure_replicas(counts, by_source, ep, replica_slots));
  }
  return run;
}

// The most tokens `bench balance` holds at once (2 GiB of ids and targets).
constexpr int64_t kMaxBenchTokens = int64_t{1} << 28;
// --ep divides moe.num_experts, which the recipe bounds by 4096.
constexpr int64_t kMaxExpertParallel = 4096;

}  // namespace

BenchCommand::BenchCommand(CLI::App& app) {
  bench_ = app.add_subcommand("bench", "measure a model");
  bench_->require_subcommand(1);
  balance_ = bench_->add_subcommand("balance", "expert load balance of a model's routing");
  balance_->add_option("source", source_,
                       "recipe file, weights directory, checkpoint (checkpoints/step_N) or "
                       "Hugging Face directory")
      ->required();
  balance_->add_option("--data", data_, "dataset directory (default: the recipe's data)");
  balance_->add_option("--synthetic", synthetic_, "synthetic tokens instead: zipf:S");
  balance_->add_option("--batches", batches_, "batches of micro_batch_size x seq_len tokens")
      ->transform(integer_in(1, kMaxBenchTokens));
  balance_->add_option("--ep", ep_, "expert-parallel size for the all-to-all (1: skip)")
      ->transform(integer_in(1, kMaxExpertParallel));
  balance_->add_option("--replica-slots", replica_slots_,
                       "with --ep: replica slots per rank for hot experts, planned per layer "
                       "(0: none)")
      ->transform(integer_in(0, kMaxExpertParallel));
  balance_->add_option("--set", overrides_,
                       "override a field of a recipe file: path=value (repeatable)");
  balance_->add_option("--compare", compare_,
                       "routing variants on the same tokens: top_k=K1,K2,..., "
                       "gating=NAME1,NAME2,..., score_function=NAME1,NAME2,... or "
                       "renormalize=true,false");
  balance_->add_option("--run-dir", run_dir_,
                       "a training run directory: each layer's imbalance over the run, from its "
                       "metrics.jsonl");
  balance_->add_option("--json", json_path_, "write the statistics as JSON");
  balance_->add_option("--report", report_path_, "write a self-contained HTML report");
  balance_->add_flag("--overwrite", overwrite_,
                     "replace an earlier bench balance's --json or --report file");
}

bool BenchCommand::parsed() const { return bench_->parsed(); }

absl::Status BenchCommand::run() {
  if (balance_->parsed()) return run_balance();
  return absl::InvalidArgumentError("bench: unknown command");
}

// --json and --report against the inputs and what is there (core/runtime/output_paths.h),
// before any work.
absl::Status BenchCommand::check_balance_outputs() const {
  std::vector<OutputPath> outputs;
  if (!json_path_.empty())
    outputs.push_back(output_file("--json", json_path_, "bench balance JSON file",
                                  [](const std::string& path) {
                                    return is_json_object_with(
                                        path, {"recipe", "batches", "tokens_per_batch"});
                                  }));
  if (!report_path_.empty())
    outputs.push_back(output_file("--report", report_path_, "bench balance report",
                                  [](const std::string& path) {
                                    return file_starts_with(
                                        path, absl::StrCat(kReportHead, kReportTitle));
                                  }));
  return check_outputs(
      input_paths({{"source", {source_}}, {"--data", {data_}}, {"--run-dir", {run_dir_}}}),
      outputs, overwrite_);
}

absl::Status BenchCommand::run_balance() {
  SY_RETURN_IF_ERROR(check_balance_outputs());
  if (!synthetic_.empty()) SY_RETURN_IF_ERROR(parse_zipf(synthetic_).status());
  SY_ASSIGN_OR_RETURN(const BenchSource loaded, load_source(source_, overrides_));
  const config::Recipe& recipe = loaded.recipe;
  const int experts = recipe.moe().num_experts();
  if (experts % ep_ != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--ep ", ep_, " must divide moe.num_experts (", experts, ")"));
  if (replica_slots_ > 0 && ep_ == 1)
    return absl::InvalidArgumentError(
        "--replica-slots needs --ep 2 or more: a replica lives on another expert-parallel rank");
  if (replica_slots_ > max_replica_slots(experts, ep_))
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica-slots ", replica_slots_, " is out of range [1, ",
        max_replica_slots(experts, ep_), "] for ", experts, " experts on --ep ", ep_,
        ": a rank holds at most as many replicas as it owns experts"));
  std::vector<Variant> variants = {{"", recipe}};
  if (!compare_.empty()) {
    SY_ASSIGN_OR_RETURN(variants, parse_compare(compare_, recipe));
  }
  std::optional<ImbalanceHistory> history;
  if (!run_dir_.empty()) {
    SY_ASSIGN_OR_RETURN(history, run_history(run_dir_));
  }
  set_cpu_threads(recipe.runtime().threads());
  set_batch_invariant(recipe.runtime().batch_invariant());
  SY_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> source,
                      make_source(recipe, source_, loaded.weights.get(), data_, synthetic_));

  // Every variant routes the same tokens.
  const int64_t batch = recipe.train().micro_batch_size();
  const int64_t seq = recipe.train().seq_len();
  SY_RETURN_IF_ERROR(checked_product({{"--batches", batches_},
                                      {"train.micro_batch_size", batch},
                                      {"train.seq_len", seq}},
                                     1, kMaxBenchTokens)
                         .status());
  std::vector<TokenBatch> batches;
  for (int64_t b = 0; b < batches_; ++b) {
    TokenBatch& tb = batches.emplace_back(TokenBatch{Tensor::empty({batch, seq}, DType::kI32),
                                                     Tensor::empty({batch, seq}, DType::kI32),
                                                     /*window_tokens=*/Tensor()});
    SY_RETURN_IF_ERROR(source->next(batch, seq, tb.ids.data<int32_t>(), tb.targets.data<int32_t>()));
    const std::vector<int32_t> window_tokens = source->window_tokens();
    if (!window_tokens.empty()) {
      tb.window_tokens = Tensor::empty({batch}, DType::kI32);
      std::copy(window_tokens.begin(), window_tokens.end(), tb.window_tokens.data<int32_t>());
    }
  }
  std::vector<BalanceRun> runs;
  for (const Variant& v : variants) {
    SY_ASSIGN_OR_RETURN(BalanceRun run, measure(v.recipe, source_, loaded.weights.get(), batches,
                                                ep_, replica_slots_));
    runs.push_back(std::move(run));
  }

  std::printf("bench balance: %s, %lld batches of %lld x %lld tokens, %d experts", recipe.name().c_str(),
              static_cast<long long>(batches_), static_cast<long long>(batch),
              static_cast<long long>(seq), experts);
  if (compare_.empty())
    std::printf(" top-%d\n", recipe.moe().top_k());
  else
    std::printf(", compared: %s\n", compare_.c_str());
  if (ep_ > 1)
    std::printf("--ep %d: a rank's load is the assignments its experts take (a token counts once "
                "for each expert it is routed to), all MoE layers together\n",
                ep_);
  print_table(variants, runs);
  if (history) {
    std::printf("run %s: %zu logged steps; each layer's max/mean at the first and the last:\n",
                run_dir_.c_str(), history->steps.size());
    for (size_t l = 0; l < history->layers.size(); ++l)
      std::printf("  layer %zu: %.3f at step %lld, %.3f at step %lld\n", l,
                  history->layers[l].front(), static_cast<long long>(history->steps.front()),
                  history->layers[l].back(), static_cast<long long>(history->steps.back()));
  }

  if (!json_path_.empty()) {
    nlohmann::ordered_json j;
    j["recipe"] = recipe.name();
    j["batches"] = batches_;
    j["tokens_per_batch"] = batch * seq;
    j["expert_parallel"] = ep_;
    auto put_run = [](nlohmann::ordered_json& into, const BalanceRun& run) {
      into["layers"] = nlohmann::ordered_json::array();
      for (const BalanceSummary& s : run.layers) into["layers"].push_back(to_json(s));
      into["overall"] = to_json(run.overall);
      if (run.placement) {
        const PlacementAdvice& a = *run.placement;
        into["placement"] = {{"advised", a.placement},
                             {"contiguous_rank_tokens", a.contiguous_loads},
                             {"advised_rank_tokens", a.advised_loads},
                             {"contiguous_max", a.contiguous_max},
                             {"advised_max", a.advised_max},
                             {"lower_bound", a.lower_bound}};
        into["ep_rank_max_over_mean"] = max_over_mean(a.contiguous_loads);
      }
      if (run.replicas) put_replicas(into, *run.replicas);
    };
    if (compare_.empty()) {
      put_run(j, runs[0]);
    } else {
      j["compare"] = compare_;
      j["variants"] = nlohmann::ordered_json::array();
      for (size_t i = 0; i < variants.size(); ++i) {
        const config::MoeConfig& moe = variants[i].recipe.moe();
        nlohmann::ordered_json v = {
            {"name", variants[i].name},
            {"top_k", moe.top_k()},
            {"gating", config::Gating_Name(moe.gating())},
            {"score_function", config::ScoreFunction_Name(moe.score_function())},
            {"renormalize", moe.renormalize()}};
        put_run(v, runs[i]);
        j["variants"].push_back(std::move(v));
      }
    }
    if (history)
      j["run_history"] = {{"run_dir", run_dir_},
                          {"steps", history->steps},
                          {"layer_imbalance", history->layers}};
    SY_RETURN_IF_ERROR(write_file_atomically(json_path_, j.dump(2) + "\n"));
  }
  if (!report_path_.empty())
    SY_RETURN_IF_ERROR(write_file_atomically(
        report_path_,
        html_report(absl::StrCat(kReportTitle, recipe.name()), variants, runs,
                    history)));
  return absl::OkStatus();
}

}  // namespace switchyard
