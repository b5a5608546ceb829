#include "engine/cli/plan_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/config/recipe.h"
#include "core/runtime/file_util.h"
#include "core/runtime/output_paths.h"
#include "core/runtime/status_macros.h"
#include "engine/cli/build_info.h"
#include "engine/cli/number_flags.h"
#include "engine/model/model_stats.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/parallel/topology.h"
#include "engine/train/memory_plan.h"
#include "engine/train/peak.h"
#include "kernels/devices.h"
#include "kernels/threads.h"

namespace switchyard {

namespace {

// The most ranks a plan considers, as for a dry run.
constexpr int kMaxPlanWorld = 4096;

struct LayoutChoice {
  int pp = 1;
  int tp = 1;
  int ep = 1;
  int zero = 0;
  config::Recompute recompute = config::NONE;
};

// The recomputation modes from the cheapest in time to the cheapest in memory.
constexpr config::Recompute kRecomputeModes[] = {config::NONE, config::SELECTIVE, config::FULL};

std::string recompute_name(config::Recompute mode) {
  return absl::AsciiStrToLower(config::Recompute_Name(mode));
}

struct Machine {
  // The model's shards, registered once for every layout planned on the machine.
  std::shared_ptr<ShardCache> shards = std::make_shared<ShardCache>();
  double memory_bytes = 0;
  double peak_flops = 0;       // one device's
  std::string peak_source;     // where peak_flops came from, for the header
  bool on_cpu = false;         // the recipe trains on the CPU (fp32 working weights)
  double bandwidth_bytes = 0;  // one rank's, per second, for every collective
};

// A layout's figures: its largest rank's memory and the step-time model's terms, in s.
struct LayoutPlan {
  LayoutChoice choice;
  Layout layout;
  RankMemory worst;
  double flops_per_rank = 0;
  double compute_s = 0;
  double recompute_s = 0;
  double all_to_all_s = 0;
  double tensor_parallel_s = 0;
  double pipeline_s = 0;  // stage-to-stage messages
  double bubble_s = 0;    // the pipeline's fill and drain
  double gradient_s = 0;
  double step_s() const {
    return compute_s + recompute_s + all_to_all_s + tensor_parallel_s + pipeline_s + bubble_s +
           gradient_s;
  }
  bool fits = false;
  // Fits but leaves less than a tenth of the device (train warns, tight_fit_warning).
  bool tight = false;
};

// "pp=2,tp=2,ep=8,zero=1,recompute=full": every key at most once, each an integer of
// [1, kMaxPlanWorld] (zero: [0, 3]) read by core/runtime/numbers.h, recompute none,
// selective or full. `*recompute_given`: whether it was named.
absl::StatusOr<LayoutChoice> parse_layout(const std::string& text, bool* recompute_given) {
  const auto refuse = [&text] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layout: want pp=N,tp=N,ep=N,zero=0..3,recompute=none|selective|full (each at most "
        "once), not \"",
        text, "\""));
  };
  LayoutChoice c;
  bool seen[5] = {false, false, false, false, false};
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const std::vector<std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    const char* keys[] = {"pp", "tp", "ep", "zero", "recompute"};
    int key = -1;
    for (int k = 0; k < 5; ++k)
      if (kv.size() == 2 && kv[0] == keys[k]) key = k;
    if (key < 0 || seen[key]) return refuse();
    seen[key] = true;
    if (key == 4) {
      const auto mode = std::find_if(std::begin(kRecomputeModes), std::end(kRecomputeModes),
                                     [&](config::Recompute m) { return recompute_name(m) == kv[1]; });
      if (mode == std::end(kRecomputeModes)) return refuse();
      c.recompute = *mode;
      continue;
    }
    int* fields[] = {&c.pp, &c.tp, &c.ep, &c.zero};
    const int low = key == 3 ? 0 : 1, high = key == 3 ? 3 : kMaxPlanWorld;
    SY_ASSIGN_OR_RETURN(const int64_t value,
                        parse_int64(kv[1], absl::StrCat("--layout ", keys[key]), low, high));
    *fields[key] = static_cast<int>(value);
  }
  *recompute_given = seen[4];
  return c;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// A ring collective moves (p - 1) / p of `bytes` through each rank, an all-reduce twice.
double ring_s(double bytes, int p, const Machine& machine) {
  return p > 1 ? bytes * (p - 1) / p / machine.bandwidth_bytes : 0;
}

// The forward FLOPs per token that backward computes again under the recipe's
// train.recompute: FULL, the recomputed layers' share of the forward without the LM head
// (every layer taken alike); SELECTIVE, attention's score and value products (as
// ModelStats counts them) and each MoE layer's experts' gate/up products.
double recompute_flops_per_token(const config::Recipe& r, const ModelStats& stats) {
  const config::ModelConfig& m = r.model();
  const double layers = m.num_layers();
  if (r.train().recompute() == config::FULL) {
    const double head = 2.0 * static_cast<double>(m.vocab_size()) * m.hidden_size();
    int recomputed = 0;
    for (int chunk : config::pipeline_chunk_layers(r))
      for (int j = 0; j < chunk; ++j) recomputed += config::recomputes_layer(r.train(), j);
    return (stats.forward_flops_per_token - head) * recomputed / layers;
  }
  if (r.train().recompute() != config::SELECTIVE) return 0;
  int moe_layers = 0;
  for (int i = 0; i < m.num_layers(); ++i) moe_layers += config::is_moe_layer(r, i);
  const double attention = 4.0 * layers * r.train().seq_len() * m.num_heads() * m.head_dim();
  const double experts = moe_layers * 2.0 * r.moe().top_k() * m.hidden_size() * 2.0 *
                         static_cast<double>(r.moe().expert_ffn_hidden_size());
  return attention + experts;
}

// The step-time model (docs/planning.md): FLOPs at the device's peak, then every
// collective at the bandwidth, none overlapped.
void estimate_step(const config::Recipe& recipe, const ModelStats& stats, const Machine& machine,
                   LayoutPlan& p) {
  const config::Recipe& r = recipe;
  const Layout& l = p.layout;
  const double b = r.runtime().precision() == "fp32" ? 4 : 2;
  const double tokens = static_cast<double>(l.global_batch_size) * r.train().seq_len();
  p.flops_per_rank = stats.train_flops_per_token * tokens / l.world_size;
  p.compute_s = p.flops_per_rank / machine.peak_flops;
  p.recompute_s = recompute_flops_per_token(r, stats) * tokens / l.world_size / machine.peak_flops;
  // Per rank and micro-batch: its tokens and, routed, the rows leaving it.
  const double n = static_cast<double>(l.micro_batch_size) * r.train().seq_len();
  const double passes = static_cast<double>(l.micro_batches_per_step);
  int moe_layers = 0;
  for (int i = 0; i < r.model().num_layers(); ++i) moe_layers += config::is_moe_layer(r, i);
  const double hidden = static_cast<double>(r.model().hidden_size());
  const double routed = n / l.tensor_parallel_size * r.moe().top_k() * hidden * b;
  const double ep = l.expert_parallel_size;
  // A rank runs its stage's layers: 1 / pp of them.
  const double stage_share = 1.0 / l.pipeline_parallel_size;
  // Dispatch and combine, forward and backward.
  p.all_to_all_s = passes * moe_layers * stage_share * 4 * routed * (ep - 1) / ep /
                   machine.bandwidth_bytes;
  // Per layer, forward and backward: two all-reduces of the activations over tp.
  p.tensor_parallel_s = passes * r.model().num_layers() * stage_share * 4 * 2 *
                        ring_s(n * hidden * b, l.tensor_parallel_size, machine);
  // Gradients once per step: dense ones over dp (reduce-scatter under ZeRO-2/3, plus
  // ZeRO-3's gathers of the values in forward and backward), expert ones over expert dp.
  const double dense = static_cast<double>(stats.total_params - stats.expert_params) * 4 /
                       l.tensor_parallel_size;
  const double expert = static_cast<double>(stats.expert_params) * 4 / l.expert_parallel_size;
  const int zero = r.parallel().zero_stage();
  p.gradient_s = (zero >= 2 ? 1 : 2) * ring_s(dense, l.data_parallel_size, machine) +
                 (zero == 3 ? 2 * passes * ring_s(dense, l.data_parallel_size, machine) : 0) +
                 2 * ring_s(expert, l.expert_data_parallel_size, machine);
  // Pipeline: per micro-batch, each of a rank's V chunks sends its output forward and its
  // input gradient back; and every rank idles the bubble's share of the pipelined work.
  const int pp = l.pipeline_parallel_size;
  p.pipeline_s = pp > 1 ? passes * 2 * l.virtual_pipeline_size * n * hidden * b /
                              machine.bandwidth_bytes
                        : 0;
  const double bubble = pipeline_bubble_fraction(l.pipeline_shape());
  p.bubble_s = (p.compute_s + p.recompute_s + p.all_to_all_s + p.tensor_parallel_s +
                p.pipeline_s) *
               bubble / (1 - bubble);
}

// A recipe that trains on the CPU: it names device "cpu", or none on a machine without a
// GPU (where train picks the CPU).
bool on_cpu(const config::Recipe& recipe) {
  const std::string& device = recipe.runtime().device();
  return device == "cpu" || (device.empty() && visible_gpus() == 0);
}

// The plan of `c` on `world` ranks; nullopt for a layout the recipe refuses.
std::optional<LayoutPlan> plan_layout(const config::Recipe& base, const ModelStats& stats,
                                      const Machine& machine, int world, LayoutChoice c,
                                      std::string* refusal) {
  config::Recipe recipe = base;
  config::ParallelConfig& parallel = *recipe.mutable_parallel();
  if (c.pp != config::effective_pipeline_size(base.parallel())) {
    // Another stage count: an even split, one chunk a stage, the recipe's schedule if it
    // runs one chunk.
    parallel.clear_pipeline_layers();
    parallel.set_virtual_pipeline_size(0);
    if (parallel.pipeline_schedule() == config::INTERLEAVED_1F1B)
      parallel.set_pipeline_schedule(config::PIPELINE_SCHEDULE_UNSPECIFIED);
  }
  parallel.set_pipeline_parallel_size(c.pp);
  recipe.mutable_parallel()->set_tensor_parallel_size(c.tp);
  recipe.mutable_parallel()->set_expert_parallel_size(c.ep);
  // A placement places experts over expert-parallel ranks: one rank has none to place.
  if (c.ep == 1) recipe.mutable_parallel()->clear_expert_placement();
  recipe.mutable_parallel()->set_zero_stage(c.zero);
  if (c.recompute != base.train().recompute()) recipe.mutable_train()->set_recompute_layers(0);
  recipe.mutable_train()->set_recompute(c.recompute);
  absl::Status valid = config::validate_recipe(recipe);
  absl::StatusOr<Layout> layout =
      valid.ok() ? make_layout(recipe, world) : absl::StatusOr<Layout>(valid);
  if (!layout.ok()) {
    *refusal = std::string(layout.status().message());
    return std::nullopt;
  }
  LayoutPlan p;
  p.choice = c;
  p.layout = *layout;
  const DType working = working_dtype(recipe.runtime().precision(), !machine.on_cpu);
  for (const RankMemory& m : plan_rank_memory(recipe, p.layout, working, machine.shards.get()))
    if (m.total() > p.worst.total()) p.worst = m;
  p.fits = p.worst.total() <= machine.memory_bytes;
  p.tight = !tight_fit_warning("", p.worst.total(), machine.memory_bytes).empty();
  estimate_step(recipe, stats, machine, p);
  return p;
}

// The plan of `c` with the least recomputation that fits with a tenth to spare, else the
// least that fits, else the one that needs least memory; nullopt for a layout the recipe
// refuses.
std::optional<LayoutPlan> least_recompute(const config::Recipe& recipe, const ModelStats& stats,
                                          const Machine& machine, int world, LayoutChoice c,
                                          std::string* refusal) {
  std::optional<LayoutPlan> plan, first_fit;
  for (config::Recompute mode : kRecomputeModes) {
    c.recompute = mode;
    plan = plan_layout(recipe, stats, machine, world, c, refusal);
    if (!plan || (plan->fits && !plan->tight)) return plan;
    if (plan->fits && !first_fit) first_fit = plan;
  }
  return first_fit ? first_fit : plan;
}

std::string layout_name(const LayoutPlan& p) {
  return absl::StrCat(absl::StrFormat("pp %d, dp %d, tp %d, ep %d, zero %d", p.choice.pp,
                                      p.layout.data_parallel_size, p.choice.tp, p.choice.ep,
                                      p.choice.zero),
                      p.choice.recompute == config::NONE
                          ? ""
                          : absl::StrCat(", recompute ", recompute_name(p.choice.recompute)));
}

// The largest of the rank's terms: what to shrink first.
std::pair<std::string, double> largest_term(const RankMemory& m) {
  const std::pair<std::string, double> terms[] = {
      {"parameters", m.parameters},         {"working copies", m.working_copies},
      {"gradients", m.gradients},           {"gradient buckets", m.gradient_buckets},
      {"optimizer state", m.optimizer_state}, {"activations", m.activations},
      {"all-to-all buffers", m.all_to_all}, {"pipeline buffers", m.pipeline_buffers}};
  return *std::max_element(std::begin(terms), std::end(terms),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
}

// ", stage 0 holding 8 micro-batches' activations" under a pipeline (in micro-batches
// through all the stage's layers), "" without one.
std::string in_flight_text(const LayoutPlan& p) {
  const PipelineShape shape = p.layout.pipeline_shape();
  if (shape.stages < 2) return "";
  const double held = static_cast<double>(pipeline_peak_chunk_passes(shape, p.worst.pp_index)) /
                      shape.virtual_chunks;
  return absl::StrFormat(", stage %d holding %.3g micro-batches' activations", p.worst.pp_index,
                         held);
}

// The step-time columns: each term's name (the header) and its seconds in that width.
struct StepTerm {
  const char* name;
  double LayoutPlan::*seconds;
};
constexpr StepTerm kStepTerms[] = {
    {"compute", &LayoutPlan::compute_s},       {"recompute", &LayoutPlan::recompute_s},
    {"all-to-all", &LayoutPlan::all_to_all_s}, {"tp", &LayoutPlan::tensor_parallel_s},
    {"pipeline", &LayoutPlan::pipeline_s},     {"bubble", &LayoutPlan::bubble_s},
    {"gradients", &LayoutPlan::gradient_s}};
constexpr int kColumn = 9;

int column_width(const char* name) {
  return std::max(kColumn, static_cast<int>(std::strlen(name)));
}

// "  #  layout    step s =   compute + ... + gradients   fullest rank's memory": what
// each row's columns are, and their unit.
std::string header_text(int layout_width) {
  std::string text =
      absl::StrFormat("  #  %-*s %*s =", layout_width, "layout", kColumn, "step s");
  for (size_t i = 0; i < std::size(kStepTerms); ++i)
    absl::StrAppend(&text, i > 0 ? " + " : " ",
                    absl::StrFormat("%*s", column_width(kStepTerms[i].name), kStepTerms[i].name));
  return absl::StrCat(text, "   fullest rank's memory");
}

std::string fit_text(const LayoutPlan& p, const Machine& machine) {
  if (p.fits) {
    std::string text = absl::StrFormat("%*.4g  ", kColumn, p.step_s());
    for (size_t i = 0; i < std::size(kStepTerms); ++i)
      absl::StrAppend(&text, i > 0 ? "   " : " ",
                      absl::StrFormat("%*.4g", column_width(kStepTerms[i].name),
                                      p.*kStepTerms[i].seconds));
    return absl::StrCat(text, "   ", size_text(p.worst.total()), " on rank ", p.worst.rank,
                        in_flight_text(p), p.tight ? ", less than a tenth left" : "");
  }
  const auto [term, bytes] = largest_term(p.worst);
  return absl::StrFormat("does not fit: rank %d needs %s of %s, the most for %s (%s)%s",
                         p.worst.rank, size_text(p.worst.total()),
                         size_text(machine.memory_bytes), term, size_text(bytes),
                         in_flight_text(p));
}

nlohmann::ordered_json plan_json(const LayoutPlan& p) {
  return {{"pipeline_parallel_size", p.choice.pp},
          {"data_parallel_size", p.layout.data_parallel_size},
          {"tensor_parallel_size", p.choice.tp},
          {"expert_parallel_size", p.choice.ep},
          {"zero_stage", p.choice.zero},
          {"recompute", recompute_name(p.choice.recompute)},
          {"fits", p.fits},
          {"tight", p.tight},
          {"largest_rank", rank_memory_json(p.worst)},
          {"flops_per_rank", p.flops_per_rank},
          {"step_s", p.step_s()},
          {"compute_s", p.compute_s},
          {"recompute_s", p.recompute_s},
          {"all_to_all_s", p.all_to_all_s},
          {"tensor_parallel_s", p.tensor_parallel_s},
          {"pipeline_s", p.pipeline_s},
          {"bubble_s", p.bubble_s},
          {"gradient_s", p.gradient_s}};
}

}  // namespace

PlanCommand::PlanCommand(CLI::App& app) {
  plan_ = app.add_subcommand(
      "plan", "per-rank memory and estimated step time of one layout or every layout of N ranks");
  plan_->add_option("recipe", recipe_path_, "recipe file (.textproto)")->required();
  plan_->add_option("--world", world_, "ranks")
      ->required()
      ->transform(integer_in(1, kMaxPlanWorld));
  plan_
      ->add_option("--device-memory", device_memory_,
                   "memory of one device: bytes, or with a unit (80GB, 80GiB)")
      ->required()
      ->check(size_with_units());
  plan_->add_option("--layout", layout_,
                    "one layout, pp=N,tp=N,ep=N,zero=0..3,recompute=none|selective|full "
                    "(unnamed: 1, 1, 1, 0, the least that fits), or `recipe` for the recipe's "
                    "own (after --set); default: every valid one");
  plan_->add_option("--gpu", gpu_, "device whose dense bf16 peak sets the compute time");
  plan_->add_option("--peak-tflops", peak_tflops_, "one device's peak TFLOP/s, instead of --gpu's")
      ->transform(real_in({1e-3, 1e6}));
  plan_
      ->add_option("--bandwidth", bandwidth_gbps_,
                   "GB/s each rank moves in all-to-all, all-reduce and all-gather")
      ->transform(real_in({1e-3, 1e6}));
  plan_->add_option("--set", overrides_, "override a recipe field: path=value (repeatable)");
  plan_->add_option("--json", json_path_, "also write the plans to this JSON file");
  plan_->add_flag("--overwrite", overwrite_, "replace an earlier plan's --json file");
}

bool PlanCommand::parsed() const { return plan_->parsed(); }

// One rank's peak: --peak-tflops; else for a CPU recipe (device "cpu", or none on a
// machine without a GPU) unless --gpu is named, this CPU's measured sgemm peak with the
// recipe's threads, as train measures it; else --gpu's dense bf16 peak.
absl::StatusOr<Peak> PlanCommand::device_peak(const config::Recipe& recipe,
                                              bool recipe_on_cpu) const {
  if (peak_tflops_ > 0) return Peak{peak_tflops_ * 1e12, "given by --peak-tflops"};
  if (recipe_on_cpu && plan_->count("--gpu") == 0) {
    const int threads = recipe.runtime().threads() > 0
                            ? recipe.runtime().threads()
                            : static_cast<int>(std::thread::hardware_concurrency());
    set_cpu_threads(threads);
    std::string warning;
    const Peak cpu =
        cpu_peak_flops(default_peak_cache_path(), build_info_line(), threads, &warning);
    if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
    return Peak{cpu.flops, absl::StrCat(cpu_model_name(), " ", cpu.source,
                                        ", as the recipe trains on the CPU (--gpu for a GPU)")};
  }
  const double flops = known_gpu_bf16_peak_flops(gpu_);
  if (flops <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu: no known peak for \"", gpu_, "\"; give --peak-tflops"));
  return Peak{flops, absl::StrCat(gpu_, " dense bf16 (--gpu)")};
}

absl::Status PlanCommand::run() {
  if (!json_path_.empty())
    SY_RETURN_IF_ERROR(check_outputs(
        {{"RECIPE", recipe_path_}},
        {output_file("--json", json_path_, "plan JSON file",
                     [](const std::string& path) {
                       return is_json_object_with(path, {"recipe", "world_size", "layouts"});
                     })},
        overwrite_));
  SY_ASSIGN_OR_RETURN(const config::Recipe recipe,
                      config::load_recipe(recipe_path_, overrides_));
  Machine machine;
  SY_ASSIGN_OR_RETURN(const int64_t memory_bytes,
                      parse_size_with_units(device_memory_, "--device-memory"));
  machine.memory_bytes = static_cast<double>(memory_bytes);
  machine.on_cpu = on_cpu(recipe);
  SY_ASSIGN_OR_RETURN(const Peak peak, device_peak(recipe, machine.on_cpu));
  machine.peak_flops = peak.flops;
  machine.peak_source = peak.source;
  machine.bandwidth_bytes = bandwidth_gbps_ * 1e9;
  std::vector<LayoutChoice> choices;
  bool recompute_given = false;
  if (layout_ == "recipe") {
    const config::ParallelConfig& parallel = recipe.parallel();
    choices.push_back({config::effective_pipeline_size(parallel), parallel.tensor_parallel_size(),
                       parallel.expert_parallel_size(), parallel.zero_stage(),
                       recipe.train().recompute()});
    recompute_given = true;
  } else if (!layout_.empty()) {
    SY_ASSIGN_OR_RETURN(const LayoutChoice c, parse_layout(layout_, &recompute_given));
    choices.push_back(c);
  } else {
    for (int pp : divisors(world_))
      for (int tp : divisors(world_ / pp))
        for (int ep : divisors(world_ / pp))
          for (int zero = 0; zero <= 3; ++zero) choices.push_back({pp, tp, ep, zero});
  }
  const ModelStats stats = compute_model_stats(recipe);
  std::vector<LayoutPlan> plans;
  std::string refusal, pipeline_refusal;
  for (const LayoutChoice& c : choices) {
    if (std::optional<LayoutPlan> p =
            recompute_given ? plan_layout(recipe, stats, machine, world_, c, &refusal)
                            : least_recompute(recipe, stats, machine, world_, c, &refusal))
      plans.push_back(*p);
    else if (c.pp > 1 && pipeline_refusal.empty())
      pipeline_refusal = refusal;
  }
  if (std::any_of(plans.begin(), plans.end(), [](const LayoutPlan& p) { return p.choice.pp > 1; }))
    pipeline_refusal.clear();
  if (plans.empty())
    return absl::InvalidArgumentError(
        layout_.empty() ? absl::StrCat("no layout of ", world_, " ranks is valid for ",
                                       recipe.name(), " (", refusal, ")")
                        : refusal);
  // Those that fit with a tenth to spare by step time (then by memory), then those that
  // fit more tightly; the others after, by memory.
  std::stable_sort(plans.begin(), plans.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits && a.tight != b.tight) return b.tight;
    if (a.fits && a.step_s() != b.step_s()) return a.step_s() < b.step_s();
    return a.worst.total() < b.worst.total();
  });
  const int fitting = static_cast<int>(std::count_if(
      plans.begin(), plans.end(), [](const LayoutPlan& p) { return p.fits; }));
  std::printf("%s on %d ranks of %s each: %d of %zu layouts fit\n", recipe.name().c_str(),
              world_, size_text(machine.memory_bytes).c_str(), fitting, plans.size());
  std::printf("compute at %.4g TFLOP/s a rank: %s; collectives at %.4g GB/s a rank\n",
              machine.peak_flops / 1e12, machine.peak_source.c_str(), bandwidth_gbps_);
  size_t layout_width = 0;
  for (const LayoutPlan& p : plans) layout_width = std::max(layout_width, layout_name(p).size());
  std::printf("%s\n", header_text(static_cast<int>(layout_width)).c_str());
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (size_t i = 0; i < plans.size(); ++i) {
    std::printf("%3zu. %-*s %s\n", i + 1, static_cast<int>(layout_width),
                layout_name(plans[i]).c_str(), fit_text(plans[i], machine).c_str());
    all.push_back(plan_json(plans[i]));
  }
  if (!pipeline_refusal.empty())
    std::printf("no layout with pp > 1 is valid: %s\n", pipeline_refusal.c_str());
  if (json_path_.empty()) return absl::OkStatus();
  const nlohmann::ordered_json j = {{"recipe", recipe.name()},
                                    {"world_size", world_},
                                    {"device_memory_bytes", machine.memory_bytes},
                                    {"peak_flops", machine.peak_flops},
                                    {"peak_source", machine.peak_source},
                                    {"bandwidth_bytes_per_s", machine.bandwidth_bytes},
                                    {"train_flops_per_token", stats.train_flops_per_token},
                                    {"layouts", all}};
  return write_file_atomically(json_path_, j.dump(1) + "\n");
}

}  // namespace switchyard
