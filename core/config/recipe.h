// Loading, overriding, defaulting and validating training recipes (recipe.proto).
//
// The order is fixed: parse the textproto, apply `--set` overrides in order, fill
// defaults, validate. Defaults come after overrides so that derived values follow the
// overridden ones (e.g. `--set model.hidden_size=256` also changes the default
// head_dim). Every error is one line that names the file position or the field path.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/recipe.pb.h"

namespace switchyard::config {

// Smallest model.vocab_size for a tokenizer trained on data.corpus; the same as
// kMinTokenizerVocabSize in data/tokenizer.h (the config layer sits below data, and a
// data test checks that the two agree).
inline constexpr int64_t kMinCorpusVocabSize = 300;
// The data.dataset of recipes that describe weights only (`convert from-hf` writes it):
// valid for eval and sample, refused by train until data is set.
inline constexpr char kPlaceholderDataset[] = "unset";

// Parses a textproto recipe and fills defaults (no validation). Syntax errors,
// unknown fields and values of the wrong type give InvalidArgument
// "<source_name>:<line>:<col>: <message>".
absl::StatusOr<Recipe> parse_recipe(std::string_view text, std::string_view source_name);

// Reads the recipe at `path`, applies each override ("field.path=value") in order,
// fills defaults and validates. An empty recipe name becomes the file's stem. Relative
// data paths in the file (data.corpus, data.dataset) are made relative to the file's
// directory; paths given as overrides are kept as given. With `quick_run_warning`, the
// recipe is fitted to its train.steps before validation (fit_schedule_to_steps) and the
// warning, if any, lands there; without it a warmup beyond train.steps is refused.
absl::StatusOr<Recipe> load_recipe(const std::string& path,
                                   const std::vector<std::string>& overrides,
                                   std::string* quick_run_warning = nullptr);

// The recipe a run saved beside its weights (load_recipe without overrides): one written
// before moe.score_function and moe.renormalize, with moe.gating TOPK_SOFTMAX,
// SOFTMAX_TOPK or SIGMOID_TOPK and moe.norm_topk_prob, is read in the new spelling
// (upgrade_legacy_routing_text), as a checkpoint's is (upgrade_legacy_routing).
absl::StatusOr<Recipe> load_saved_recipe(const std::string& path);

// `text` with a legacy moe.gating line (as a saved recipe prints it) and a sigmoid
// gating's norm_topk_prob line replaced by the settings that mean the same; any other
// text as it is.
std::string upgrade_legacy_routing_text(std::string_view text);

// A quick run: train.steps shorter than the recipe's schedule. An
// optimizer.warmup_steps beyond train.steps becomes train.steps (so the recipe a run
// saves records the warmup that ran); a train.eval_interval or
// checkpoint.interval_steps beyond it is kept and means "at the last step", where
// evaluation and a checkpoint happen anyway. Returns one warning line naming each of
// them, or "" when train.steps covers them all (or any of them is negative, which
// validation refuses).
std::string fit_schedule_to_steps(Recipe& recipe);

// Sets one scalar field from "field.path=value", e.g. "train.steps=200",
// "moe.score_function=SIGMOID", "model.tie_embeddings=true", "data.corpus=foo.txt".
// Enums take value names; bools take true/false/1/0; strings are taken verbatim.
absl::Status apply_override(Recipe& recipe, std::string_view assignment);

// Replaces every zero or unset field that has a default (see recipe.proto) with that
// default. Idempotent.
void fill_defaults(Recipe& recipe);

// A recipe read from a checkpoint written before moe.score_function and moe.renormalize:
// its moe.gating TOPK_SOFTMAX, SOFTMAX_TOPK or SIGMOID_TOPK (now reserved numbers) and
// moe.norm_topk_prob (now an unknown field) become the settings that mean the same, and
// the new settings' defaults are filled, as the recipe that trains on would fill them. A
// recipe that has them already is left as it is.
void upgrade_legacy_routing(MoeConfig& moe);

// Checks a recipe whose defaults are filled; the error names the offending field path.
absl::Status validate_recipe(const Recipe& recipe);

// moe.renormalize, or when unset its default: true for GSHARD_TOP2 and for TOP_K with
// softmax scores (Mixtral), false for TOP_K with sigmoid scores and for EXPERT_CHOICE.
bool effective_renormalize(const MoeConfig& moe);
// num_kv_heads, or num_heads when it is 0.
int32_t effective_kv_heads(const ModelConfig& model);
// head_dim, or hidden_size / num_heads when it is 0.
int32_t effective_head_dim(const ModelConfig& model);
// mtp_loss_coef, or 0.3 when it is unset.
float effective_mtp_loss_coef(const ModelConfig& model);

// Pipeline stages, model chunks per stage (0 means 1) and the schedule
// (PIPELINE_SCHEDULE_UNSPECIFIED: ONE_F_ONE_B, or INTERLEAVED_1F1B with more than one
// chunk per stage).
int32_t effective_pipeline_size(const ParallelConfig& parallel);
int32_t effective_virtual_pipeline_size(const ParallelConfig& parallel);
PipelineSchedule effective_pipeline_schedule(const ParallelConfig& parallel);
// Layers of each model chunk in depth order (pipeline size x virtual size entries):
// parallel.pipeline_layers, or an even split whose first chunks take one more layer
// (with parallel.pipeline_ends_as_layers, of the layers plus the embedding and the head,
// which the first and last chunk then hold in place of a layer each). For a validated
// recipe.
std::vector<int> pipeline_chunk_layers(const Recipe& recipe);

// Whether train.recompute FULL keeps only the input of the layer at `index_in_chunk`
// (0-based) of its model chunk: every layer, or with train.recompute_layers N the first N
// of each chunk (of each pipeline stage, when it holds one chunk; of the model without
// pipeline stages).
bool recomputes_layer(const TrainConfig& train, int index_in_chunk);

// Whether decoder layer `layer` (0-based) is an MoE layer, per
// model.moe_layer_interval and model.first_dense_layers.
bool is_moe_layer(const Recipe& recipe, int layer);

// Two lines for logs: the model shape, then the training setup.
std::string summarize_recipe(const Recipe& recipe);

}  // namespace switchyard::config
