#include "engine/cli/sample_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/runtime/device.h"
#include "core/runtime/rng.h"
#include "core/runtime/status_macros.h"
#include "core/runtime/text.h"
#include "data/tokenizer.h"
#include "engine/cli/load_model.h"
#include "engine/cli/number_flags.h"
#include "engine/model/transformer.h"

namespace switchyard {

namespace {

struct SamplingOptions {
  double temperature = 0;  // 0: the most likely token
  int64_t top_k = 0;       // 0: every token
  double top_p = 1;
};

struct GenerationOptions {
  int64_t tokens = 0;
  SamplingOptions sampling;
  int64_t valid_ids = 0;  // the tokenizer's ids [0, valid_ids): the embedding may be padded
  int32_t eos = -1;       // -1: none
  bool stop_at_eos = true;
  std::vector<std::string> stops;
  bool kv_cache = true;
};

struct Generation {
  std::vector<int32_t> ids;  // generated, without the eos that ended them
  std::string text;          // what they add to the prompt, up to a stop string
};

// The next token from one position's logits over the ids [0, valid): the most likely
// one at temperature 0 (the first of equal ones, as argmax), else a draw from the softmax
// of logits / temperature over the top_k most likely ids, then over the smallest set of
// the most likely whose probability reaches top_p (transformers' order of the three).
int32_t pick_token(const float* logits, int64_t valid, const SamplingOptions& o, Rng& rng) {
  if (o.temperature == 0)
    return static_cast<int32_t>(std::max_element(logits, logits + valid) - logits);
  std::vector<int32_t> order(static_cast<size_t>(valid));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [logits](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t top_k = o.top_k > 0 ? std::min(o.top_k, valid) : valid;
  std::vector<double> p(static_cast<size_t>(top_k));
  double z = 0;
  for (int64_t i = 0; i < top_k; ++i)
    z += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / o.temperature);
  int64_t kept = top_k;
  double mass = 0;
  for (int64_t i = 0; i < top_k && kept == top_k; ++i)
    if ((mass += p[i]) >= o.top_p * z) kept = i + 1;
  double u = rng.uniform() * std::accumulate(p.begin(), p.begin() + kept, 0.0);
  for (int64_t i = 0; i + 1 < kept; ++i)
    if ((u -= p[i]) < 0) return order[i];
  return order[kept - 1];
}

// The logits after `context`, of which the cache (if any) holds a prefix already.
Tensor next_logits(Transformer& model, const std::vector<int32_t>& context, DecodeCache* cache) {
  if (cache)
    return model.decode(
        cpu_device(), std::vector<int32_t>(context.begin() + cache->length, context.end()), *cache);
  const int64_t len = static_cast<int64_t>(context.size());
  Tensor ids = Tensor::empty({1, len}, DType::kI32);
  std::copy(context.begin(), context.end(), ids.data<int32_t>());
  const Tensor logits = model.logits(cpu_device(), ids);
  return logits.slice_rows(len - 1, len).reshape({logits.row_size()});
}

// The text `generated` adds to the prompt: decoded after the prompt's ids, so that a
// first piece keeps its leading space; each eos (a document boundary in the training
// data) shows as a blank line.
absl::StatusOr<std::string> continuation(const Tokenizer& tokenizer,
                                         const std::vector<int32_t>& prompt,
                                         const std::vector<int32_t>& generated, int32_t eos) {
  SY_ASSIGN_OR_RETURN(const std::string before, tokenizer.decode(prompt));
  std::vector<int32_t> piece = prompt;
  std::string text;
  bool first = true;
  auto flush = [&]() -> absl::Status {
    SY_ASSIGN_OR_RETURN(std::string decoded, tokenizer.decode(piece));
    if (first && absl::StartsWith(decoded, before)) {
      decoded.erase(0, before.size());
    } else if (first) {
      const auto generated_part = absl::MakeConstSpan(piece).subspan(prompt.size());
      SY_ASSIGN_OR_RETURN(decoded, tokenizer.decode(generated_part));
    }
    text += decoded;
    first = false;
    piece.clear();
    return absl::OkStatus();
  };
  for (const int32_t id : generated) {
    if (id == eos) {
      SY_RETURN_IF_ERROR(flush());
      text += "\n\n";
    } else {
      piece.push_back(id);
    }
  }
  SY_RETURN_IF_ERROR(flush());
  return text;
}

// Cuts `text` before the first stop string it holds; whether there was one.
bool cut_at_stop(std::string& text, const std::vector<std::string>& stops) {
  size_t cut = std::string::npos;
  for (const std::string& stop : stops) cut = std::min(cut, text.find(stop));
  if (cut == std::string::npos) return false;
  text.resize(cut);
  return true;
}

absl::StatusOr<Generation> generate(Transformer& model, const Tokenizer& tokenizer,
                                    const std::vector<int32_t>& prompt,
                                    const GenerationOptions& o, Rng& rng) {
  std::optional<DecodeCache> cache;
  if (o.kv_cache) cache = model.start_decoding(static_cast<int64_t>(prompt.size()) + o.tokens);
  std::vector<int32_t> context = prompt;
  Generation g;
  for (int64_t i = 0; i < o.tokens; ++i) {
    const Tensor logits = next_logits(model, context, cache ? &*cache : nullptr);
    const int32_t next = pick_token(logits.data<float>(), o.valid_ids, o.sampling, rng);
    if (next == o.eos && o.stop_at_eos) break;
    g.ids.push_back(next);
    context.push_back(next);
    if (o.stops.empty()) continue;
    SY_ASSIGN_OR_RETURN(g.text, continuation(tokenizer, prompt, g.ids, o.eos));
    if (cut_at_stop(g.text, o.stops)) return g;
  }
  SY_ASSIGN_OR_RETURN(g.text, continuation(tokenizer, prompt, g.ids, o.eos));
  return g;
}

// The bounds of the flags. A model has at most 2^24 positions and 2^24 tokens in its
// vocabulary (the recipe's bounds), so --tokens and --top-k need no more, and the prompt
// and --tokens add up without overflow. Logits span far less than 1000, so a temperature
// above it draws every kept token about as often: it is the most that means anything.
constexpr int64_t kMaxPositions = int64_t{1} << 24;
constexpr double kMaxTemperature = 1000;

uint64_t random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) | device();
}

}  // namespace

SampleCommand::SampleCommand(CLI::App& app) {
  sample_ = app.add_subcommand("sample", "generate text from saved weights");
  sample_->add_option("checkpoint", weights_dir_, "weights directory")->required();
  sample_->add_option("--prompt", prompt_, "text to continue")->required();
  tokens_option_ =
      sample_
          ->add_option("--tokens", tokens_,
                       "most tokens to generate; given, the prompt and they must fit in the "
                       "model's max_position_embeddings; unset, fewer than 200 where that leaves "
                       "less room")
          ->transform(integer_in(1, kMaxPositions));
  sample_
      ->add_option("--temperature", temperature_,
                   "softmax temperature; 0 picks the most likely token")
      ->transform(real_in({0, kMaxTemperature}));
  sample_->add_option("--top-k", top_k_, "sample among the K most likely tokens (0: all)")
      ->transform(integer_in(0, kMaxPositions));
  sample_
      ->add_option("--top-p", top_p_,
                   "sample among the most likely tokens whose probability reaches P, in (0, 1]")
      ->transform(real_in({0, 1, /*min_open=*/true}));
  seed_option_ =
      sample_->add_option("--seed", seed_, "sampling seed (unset: a random one, printed to stderr)")
          ->transform(seed_value())
          ->default_str("random");
  sample_->add_flag("--ignore-eos", ignore_eos_,
                    "go on past the end-of-sequence token (shown as a blank line)");
  sample_->add_option("--stop", stops_,
                      "stop once the generated text holds this string, which is not printed "
                      "(repeatable)");
  sample_->add_flag("--ids", print_ids_,
                    "print the prompt's and the generated token ids as JSON instead of text");
  sample_->add_flag("--no-kv-cache", no_kv_cache_,
                    "recompute the whole sequence for every token instead of caching keys and "
                    "values (slow; for comparison)");
}

bool SampleCommand::parsed() const { return sample_->parsed(); }

absl::Status SampleCommand::check_flags() const {
  for (const std::string& stop : stops_)
    if (stop.empty()) return absl::InvalidArgumentError("--stop must not be empty");
  return absl::OkStatus();
}

absl::Status SampleCommand::run() {
  SY_RETURN_IF_ERROR(check_flags());
  LoadedModel lm;
  SY_RETURN_IF_ERROR(load_model(weights_dir_, lm));
  const Tokenizer& tokenizer = *lm.tokenizer;
  GenerationOptions options;
  options.tokens = tokens_;
  options.sampling = {temperature_, top_k_, top_p_};
  options.valid_ids = std::min<int64_t>(lm.recipe.model().vocab_size(), tokenizer.vocab_size());
  options.eos = static_cast<int32_t>(tokenizer.special_ids().eos);
  options.stop_at_eos = !ignore_eos_;
  options.stops = stops_;
  options.kv_cache = !no_kv_cache_;

  std::vector<int32_t> prompt = tokenizer.encode(prompt_);
  if (prompt.empty() && options.eos >= 0) prompt.push_back(options.eos);
  if (prompt.empty())
    return absl::InvalidArgumentError("--prompt is empty and the tokenizer has no eos to start from");
  const int64_t positions = lm.recipe.model().max_position_embeddings();
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  if (prompt_tokens >= positions)
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt (", prompt_tokens, " tokens) leaves no room in model.max_position_embeddings (",
        positions, ") of ", weights_dir_));
  if (tokens_option_->count() == 0) options.tokens = std::min(tokens_, positions - prompt_tokens);
  const absl::StatusOr<int64_t> length =
      checked_sum({{"--prompt's tokens", prompt_tokens}, {"--tokens", options.tokens}}, 1, positions);
  if (!length.ok())
    return absl::InvalidArgumentError(absl::StrCat(length.status().message(),
                                                   " (model.max_position_embeddings of ",
                                                   weights_dir_, ")"));

  if (!no_kv_cache_)
    SY_RETURN_IF_ERROR(check_fits(
        cpu_device(), lm.model->decode_cache_bytes(*length),
        absl::StrCat("the key/value cache of ", *length, " positions")));
  uint64_t seed = seed_;
  if (seed_option_->count() == 0 && temperature_ > 0) {
    seed = random_seed();
    std::fprintf(stderr, "switchyard sample: seed %llu (--seed %llu repeats this sample)\n",
                 static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  }
  Rng rng(seed);
  SY_ASSIGN_OR_RETURN(const Generation g, generate(*lm.model, tokenizer, prompt, options, rng));
  if (print_ids_) {
    const nlohmann::ordered_json j = {{"prompt_ids", prompt}, {"generated_ids", g.ids}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    // A sampled byte-fallback piece can end mid-character: the text printed is UTF-8.
    std::printf("%s%s\n", prompt_.c_str(), to_valid_utf8(g.text).c_str());
  }
  return absl::OkStatus();
}

}  // namespace switchyard
