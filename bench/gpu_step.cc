// GPU training-step benchmark: whole steps (Transformer forward with every loss term,
// backward, AdamW with gradient clipping) of a Mixtral-shaped model on a CudaDevice, as
// the trainer runs them. Prints tokens/s, train FLOPs/token (compute_model_stats), the
// achieved TFLOP/s and MFU against the bf16 peak from the GPU's clock and multiprocessors
// (kernels/devices.h) and, when given, against a measured bf16 cuBLAS peak; then one
// untimed step split into forward, backward and optimizer, and last one JSON line.
// bench/gpu_pytorch_step.py runs the same model in PyTorch. Exits 77 without a GPU.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config/recipe.h"
#include "engine/model/model_stats.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/train/peak.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/devices.h"

namespace switchyard {
namespace {

struct Options {
  std::string preset = "coarse";
  int64_t hidden = 1024;
  int64_t layers = 4;
  int64_t heads = 16;
  int64_t kv_heads = 4;
  int64_t experts = 0;  // 0: the preset's
  int64_t top_k = 0;
  int64_t ffn = 0;
  int64_t vocab = 32000;
  int64_t seq = 1024;
  int64_t batch = 8;
  int warmup = 2;
  int steps = 5;
  double bf16_peak_tflops = 0;  // measured (gpu_ops); 0: not given
  std::string precision = "bf16";
  // runtime.max_logits_mb: enough to keep the default shape's 1 GiB of f32 logits whole,
  // as PyTorch does, so both sides do the same products.
  int max_logits_mb = 2048;
};

// Expert layouts: Mixtral's few large experts, and many small ones with more of them
// per token (OLMoE-like) at a similar active FFN size.
struct ExpertLayout {
  int64_t experts, top_k, ffn;
};
const std::map<std::string, ExpertLayout> kPresets = {{"coarse", {8, 2, 2816}},
                                                      {"fine", {64, 8, 512}}};

// Hyperparameters as in bench/gpu_pytorch_step.py (and recipes/tiny.textproto): AdamW
// at a constant rate, clipping at 1.0, transformers' Mixtral router aux loss and no
// z-loss (Mixtral has none).
std::string recipe_text(const Options& o) {
  char text[2048];
  std::snprintf(text, sizeof(text), R"(
    name: "gpu-step-%s"
    model { vocab_size: %lld hidden_size: %lld num_layers: %lld num_heads: %lld
            num_kv_heads: %lld rope_theta: 10000 norm_eps: 1e-5 tie_embeddings: false
            init_std: 0.02 }
    moe { num_experts: %lld top_k: %lld gating: TOP_K score_function: SOFTMAX renormalize: true
          capacity_factor: 0
          aux_loss_coef: 0.01 z_loss_coef: 0 expert_ffn_hidden_size: %lld }
    optimizer { lr: 3e-3 beta1: 0.9 beta2: 0.95 weight_decay: 0.1 warmup_steps: 0
                decay: CONSTANT grad_clip: 1.0 }
    train { global_batch_size: %lld micro_batch_size: %lld seq_len: %lld steps: %d seed: 1 }
    runtime { max_logits_mb: %d }
  )",
                o.preset.c_str(), static_cast<long long>(o.vocab), static_cast<long long>(o.hidden),
                static_cast<long long>(o.layers), static_cast<long long>(o.heads),
                static_cast<long long>(o.kv_heads), static_cast<long long>(o.experts),
                static_cast<long long>(o.top_k), static_cast<long long>(o.ffn),
                static_cast<long long>(o.batch), static_cast<long long>(o.batch),
                static_cast<long long>(o.seq), o.warmup + o.steps + 1, o.max_logits_mb);
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  using namespace switchyard;
  Options o;
  CLI::App app{"GPU training-step benchmark of a Mixtral-shaped model"};
  app.add_option("--preset", o.preset,
                 "expert layout: coarse (8 experts top-2, ffn 2816) or "
                 "fine (64 experts top-8, ffn 512)")
      ->check(CLI::IsMember({"coarse", "fine"}));
  app.add_option("--hidden", o.hidden, "hidden size");
  app.add_option("--layers", o.layers, "decoder layers");
  app.add_option("--heads", o.heads, "attention heads");
  app.add_option("--kv-heads", o.kv_heads, "KV heads");
  app.add_option("--experts", o.experts, "experts (default: the preset's)");
  app.add_option("--top-k", o.top_k, "experts per token (default: the preset's)");
  app.add_option("--ffn", o.ffn, "expert FFN hidden size (default: the preset's)");
  app.add_option("--vocab", o.vocab, "vocabulary size");
  app.add_option("--seq", o.seq, "sequence length");
  app.add_option("--batch", o.batch, "sequences per step");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--precision", o.precision, "compute precision (runtime.precision)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--max-logits-mb", o.max_logits_mb,
                 "f32 logits held at once (runtime.max_logits_mb); below the micro-batch's, "
                 "the LM head scores in chunks and recomputes them in backward")
      ->check(CLI::PositiveNumber);
  app.add_option("--bf16-peak-tflops", o.bf16_peak_tflops,
                 "measured bf16 GEMM peak (gpu_ops) to report MFU against as well");
  CLI11_PARSE(app, argc, argv);
  const ExpertLayout& layout = kPresets.at(o.preset);
  if (o.experts == 0) o.experts = layout.experts;
  if (o.top_k == 0) o.top_k = layout.top_k;
  if (o.ffn == 0) o.ffn = layout.ffn;

  auto parsed = config::parse_recipe(recipe_text(o), "gpu_step");
  if (!parsed.ok()) {
    std::fprintf(stderr, "gpu_step: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  const config::Recipe recipe = *parsed;
  if (cuda_device_count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }

  CudaDevice dev(0);
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(dev, o.precision == "bf16" ? DType::kBF16 : DType::kF32);
  params.initialize(recipe.train().seed());
  refresh_working_copies(dev, params);
  AdamWOptimizer optimizer(recipe.optimizer(), recipe.train().steps(), params,
                           AdamWOptimizer::Groups{}, dev);

  // Random tokens and targets, on the device from the start: the step is timed, not the
  // input copy.
  Tensor ids_host = Tensor::empty({o.batch, o.seq}, DType::kI32);
  Tensor targets_host = Tensor::empty({o.batch, o.seq}, DType::kI32);
  Rng data(2);
  for (int64_t i = 0; i < ids_host.numel(); ++i) {
    ids_host.data<int32_t>()[i] = static_cast<int32_t>(data.below(o.vocab));
    targets_host.data<int32_t>()[i] = static_cast<int32_t>(data.below(o.vocab));
  }
  const Tensor ids = ids_host.to(dev);
  const Tensor targets = targets_host.to(dev);

  int64_t step = 0;
  LossParts loss;
  auto forward = [&] {
    Rng routing(static_cast<uint64_t>(++step));
    loss = model.forward(dev, ids, targets, /*training=*/true, routing);
  };

  for (int i = 0; i < o.warmup; ++i) {
    forward();
    model.backward(dev, 1.0f);
    optimizer.step(dev);
  }
  dev.synchronize();
  const int64_t transfers_before = dev.host_transfers();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) {
    forward();
    model.backward(dev, 1.0f);
    optimizer.step(dev);
  }
  dev.synchronize();
  const double seconds = seconds_since(start);
  // Copies between the GPU and the host, each a wait for the stream (Device::host_transfers).
  const double transfers_per_step =
      static_cast<double>(dev.host_transfers() - transfers_before) / o.steps;

  // One more step with the device drained between its parts, for where the time goes.
  auto part = [&](auto&& fn) {
    const auto t = std::chrono::steady_clock::now();
    fn();
    dev.synchronize();
    return 1e3 * seconds_since(t);
  };
  const double forward_ms = part(forward);
  const double backward_ms = part([&] { model.backward(dev, 1.0f); });
  const double optimizer_ms = part([&] { optimizer.step(dev); });

  const ModelStats stats = compute_model_stats(recipe);
  const double tokens_per_s = static_cast<double>(o.steps * o.batch * o.seq) / seconds;
  const double achieved = tokens_per_s * stats.train_flops_per_token;
  const Peak peak = gpu_peak(dev, 1);
  const double spec_peak = peak.flops;
  const double mfu = spec_peak > 0 ? achieved / spec_peak : 0;
  const double measured_peak = o.bf16_peak_tflops * 1e12;
  const double mfu_measured = measured_peak > 0 ? achieved / measured_peak : 0;

  std::printf(
      "engine step, preset %s: hidden %lld, layers %lld, heads %lld (kv %lld), %lld "
      "experts top-%lld, expert ffn %lld, vocab %lld, seq %lld, batch %lld; %s; logits held "
      "%d MiB at most\n",
      o.preset.c_str(), static_cast<long long>(o.hidden), static_cast<long long>(o.layers),
      static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
      static_cast<long long>(o.experts), static_cast<long long>(o.top_k),
      static_cast<long long>(o.ffn), static_cast<long long>(o.vocab), static_cast<long long>(o.seq),
      static_cast<long long>(o.batch), o.precision.c_str(), o.max_logits_mb);
  std::printf("parameters %.1fM (%.1fM active per token); %d warm-up + %d timed steps; loss %.4f\n",
              stats.total_params / 1e6, stats.active_params / 1e6, o.warmup, o.steps, loss.total);
  std::printf("tokens/s %.0f; train FLOPs/token %.1fM; achieved %.2f TFLOP/s\n", tokens_per_s,
              stats.train_flops_per_token / 1e6, achieved / 1e12);
  std::printf("MFU %.2f%% of the bf16 peak the trainer uses (%.0f TFLOP/s, %s)", 100 * mfu,
              spec_peak / 1e12, peak.source.c_str());
  if (measured_peak > 0)
    std::printf(", %.2f%% of the measured bf16 GEMM peak (%.0f TFLOP/s)", 100 * mfu_measured,
                o.bf16_peak_tflops);
  std::printf(
      "\none step drained between parts: forward %.1f ms, backward %.1f ms, optimizer "
      "%.1f ms; peak device memory %.2f GB; %.1f host transfers per step\n",
      forward_ms, backward_ms, optimizer_ms, dev.memory_stats().total_peak_bytes / 1e9,
      transfers_per_step);

  nlohmann::ordered_json result = {{"bench", "gpu_step"},
                                   {"preset", o.preset},
                                   {"precision", o.precision},
                                   {"shape",
                                    {{"hidden", o.hidden},
                                     {"layers", o.layers},
                                     {"heads", o.heads},
                                     {"kv_heads", o.kv_heads},
                                     {"experts", o.experts},
                                     {"top_k", o.top_k},
                                     {"ffn", o.ffn},
                                     {"vocab", o.vocab},
                                     {"seq", o.seq},
                                     {"batch", o.batch}}},
                                   {"max_logits_mb", o.max_logits_mb},
                                   {"steps", o.steps},
                                   {"tokens_per_s", tokens_per_s},
                                   {"train_flops_per_token", stats.train_flops_per_token},
                                   {"achieved_tflops", achieved / 1e12},
                                   {"bf16_spec_tflops", spec_peak / 1e12},
                                   {"mfu", mfu},
                                   {"bf16_measured_tflops", o.bf16_peak_tflops},
                                   {"mfu_measured", mfu_measured},
                                   {"forward_ms", forward_ms},
                                   {"backward_ms", backward_ms},
                                   {"optimizer_ms", optimizer_ms},
                                   {"peak_memory_bytes", dev.memory_stats().total_peak_bytes},
                                   {"host_transfers_per_step", transfers_per_step},
                                   {"loss", loss.total}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
