// GPU op benchmark: the ceilings of this GPU, measured in the same run (device-to-device
// copy bandwidth, cuBLAS fp32 and bf16 GEMM), then the engine's hot ops at the shapes of
// one Mixtral-shaped MoE layer and its loss, each against the ceiling that bounds it:
// GEMMs and attention in TFLOP/s against the fp32 GEMM (the engine computes in fp32),
// the memory-bound ops in GB/s against the copy. Then the grouped expert GEMMs on bf16
// operands three ways, the engine's tensor-core kernel, the per-expert cuBLASLt loop and
// one cuBLAS grouped batched call, on balanced and skewed expert sizes, against the bf16
// GEMM. Times are cudaEvents on the device's stream: two warm-up calls, then the median
// of timed repetitions. Prints a table and, last, one JSON line. Exits 77 without a GPU.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/runtime/rng.h"
#include "core/runtime/tensor.h"
#include "engine/train/peak.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/devices.h"
#include "kernels/gating.h"
#include "kernels/gemm.h"
#include "kernels/permute.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"

namespace switchyard {
namespace {

struct Options {
  int64_t hidden = 1024;
  int64_t experts = 8;
  int64_t top_k = 2;
  int64_t ffn = 2816;
  int64_t tokens = 8192;
  int64_t heads = 16;
  int64_t kv_heads = 4;
  int64_t seq = 1024;
  int64_t vocab = 32000;
  int64_t adamw_elements = 100'000'000;
  int64_t gemm_size = 8192;
  int reps = 10;
};

// Uniform values in [-1, 1), tiled from one host block. The values do not change the
// work, but all-zero operands would let the GPU draw less power and clock higher than
// on real data. bf16 elements are the high halves of the same floats.
void fill_random(Device& dev, Tensor& t) {
  static const std::vector<float> block = [] {
    std::vector<float> v(1 << 22);
    Rng rng(1);
    for (float& x : v) x = static_cast<float>(2 * rng.uniform() - 1);
    return v;
  }();
  static const std::vector<uint16_t> block_bf16 = [] {
    std::vector<uint16_t> v(block.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &block[i], sizeof(bits));
      v[i] = static_cast<uint16_t>(bits >> 16);
    }
    return v;
  }();
  SY_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16);
  const void* src = t.dtype() == DType::kF32 ? static_cast<const void*>(block.data())
                                             : static_cast<const void*>(block_bf16.data());
  const size_t block_bytes = block.size() * dtype_size(t.dtype());
  char* dst = static_cast<char*>(t.raw_data());
  for (size_t offset = 0; offset < t.nbytes(); offset += block_bytes)
    dev.copy_from_host(dst + offset, src, std::min(block_bytes, t.nbytes() - offset));
}

Tensor random_tensor(CudaDevice& dev, const Shape& shape, DType dtype = DType::kF32) {
  Tensor t = Tensor::empty(shape, dtype, MemoryKind::kOther, dev);
  fill_random(dev, t);
  return t;
}

Tensor device_tensor(CudaDevice& dev, const Shape& shape, DType dtype = DType::kF32) {
  return Tensor::empty(shape, dtype, MemoryKind::kOther, dev);
}

// Median milliseconds per call of `op`. A repetition runs `op` back to back as often as
// fills about a millisecond (at most 100 times), so that short kernels are not timed at
// the events' resolution, and is divided by that count.
double median_ms(CudaDevice& dev, int reps, const std::function<void()>& op) {
  cudaStream_t stream = dev.stream();
  cudaEvent_t start, stop;
  SY_CUDA_CHECK(cudaEventCreate(&start));
  SY_CUDA_CHECK(cudaEventCreate(&stop));
  auto run = [&](int calls) {
    SY_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) op();
    SY_CUDA_CHECK(cudaEventRecord(stop, stream));
    SY_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SY_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / calls;
  };
  run(2);  // warm-up: first-call setup (cuBLAS heuristics, memory pools) is not timed
  const int calls = std::clamp(static_cast<int>(1.0 / std::max(run(1), 1e-3)), 1, 100);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) times.push_back(run(calls));
  SY_CUDA_CHECK(cudaEventDestroy(start));
  SY_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[reps / 2];
}

// Square row-major GEMM C = A @ B of n x n operands of `type` with fp32 accumulation, as
// cuBLAS's column-major C^T = B^T A^T.
void square_gemm(cublasHandle_t handle, cudaDataType_t type, int n, const void* a, const void* b,
                 void* c) {
  const float alpha = 1.0f, beta = 0.0f;
  SY_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, b, type, n, a,
                               type, n, &beta, c, type, n, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

struct Ceilings {
  double copy_gbs = 0;
  double fp32_tflops = 0;
  double bf16_tflops = 0;
};

enum class Bound { kCompute, kMemory };

struct Row {
  std::string op;
  double ms;
  Bound bound;
  double amount;  // FLOPs (compute-bound) or bytes moved (memory-bound) per call
};

class Table {
 public:
  explicit Table(const Ceilings& c) : c_(c) {}

  void add(const Row& row) {
    rows_.push_back(row);
    const double rate = row.amount / (row.ms * 1e-3);
    if (row.bound == Bound::kCompute) {
      std::printf("%-34s %10.3f ms %9.2f TFLOP/s %6.1f%% of fp32 GEMM\n", row.op.c_str(), row.ms,
                  rate / 1e12, 100 * rate / 1e12 / c_.fp32_tflops);
    } else {
      std::printf("%-34s %10.3f ms %9.1f GB/s    %6.1f%% of copy\n", row.op.c_str(), row.ms,
                  rate / 1e9, 100 * rate / 1e9 / c_.copy_gbs);
    }
    std::fflush(stdout);
  }

  nlohmann::ordered_json json() const {
    nlohmann::ordered_json ops = nlohmann::ordered_json::array();
    for (const Row& row : rows_) {
      const double rate = row.amount / (row.ms * 1e-3);
      nlohmann::ordered_json j = {{"op", row.op}, {"ms", row.ms}};
      if (row.bound == Bound::kCompute) {
        j["tflops"] = rate / 1e12;
        j["pct_of_fp32_gemm"] = 100 * rate / 1e12 / c_.fp32_tflops;
      } else {
        j["gbs"] = rate / 1e9;
        j["pct_of_copy"] = 100 * rate / 1e9 / c_.copy_gbs;
      }
      ops.push_back(j);
    }
    return ops;
  }

 private:
  Ceilings c_;
  std::vector<Row> rows_;
};

Ceilings measure_ceilings(CudaDevice& dev, const Options& o) {
  Ceilings c;
  {
    const int64_t elements = 256 << 20;  // 1 GiB of f32
    Tensor src = random_tensor(dev, {elements});
    Tensor dst = device_tensor(dev, {elements});
    const double ms = median_ms(dev, o.reps, [&] { dst.copy_from(src); });
    c.copy_gbs = 2.0 * src.nbytes() / (ms * 1e-3) / 1e9;
    std::printf("%-34s %10.3f ms %9.1f GB/s    (read + write)\n", "copy device-to-device 1 GiB", ms,
                c.copy_gbs);
  }
  const int n = static_cast<int>(o.gemm_size);
  const double flops = 2.0 * n * n * n;
  for (const auto& [dtype, type, name, result] :
       {std::tuple{DType::kF32, CUDA_R_32F, "fp32", &c.fp32_tflops},
        std::tuple{DType::kBF16, CUDA_R_16BF, "bf16", &c.bf16_tflops}}) {
    Tensor a = random_tensor(dev, {n, n}, dtype);
    Tensor b = random_tensor(dev, {n, n}, dtype);
    Tensor out = device_tensor(dev, {n, n}, dtype);
    const double ms = median_ms(dev, o.reps, [&] {
      square_gemm(dev.cublas(), type, n, a.raw_data(), b.raw_data(), out.raw_data());
    });
    *result = flops / (ms * 1e-3) / 1e12;
    const std::string label = std::string("cuBLAS ") + name + " GEMM " + std::to_string(n) + "^3";
    std::printf("%-34s %10.3f ms %9.2f TFLOP/s (fp32 accumulate)\n", label.c_str(), ms, *result);
  }
  std::fflush(stdout);
  return c;
}

// The ops of one decoder block (norm, MoE forward: router, gating, permutation, expert
// FFN, combine; the expert down projection's backward; attention forward and backward),
// then the loss over the vocabulary and the optimizer.
void measure_ops(CudaDevice& dev, const Options& o, Table& table) {
  const int64_t T = o.tokens, H = o.hidden, E = o.experts, K = o.top_k, F = o.ffn;
  const auto f32 = static_cast<double>(sizeof(float));
  const auto i32 = static_cast<double>(sizeof(int32_t));
  auto timed = [&](const std::function<void()>& op) { return median_ms(dev, o.reps, op); };

  Tensor x = random_tensor(dev, {T, H});
  Tensor norm_weight = random_tensor(dev, {H});
  Tensor normed = device_tensor(dev, {T, H});
  Tensor rstd = device_tensor(dev, {T});
  table.add({"rmsnorm_forward",
             timed([&] { rmsnorm_forward(dev, x, norm_weight, 1e-5f, normed, rstd); }),
             Bound::kMemory, 2 * T * H * f32});

  Tensor router = random_tensor(dev, {E, H});
  Tensor logits = device_tensor(dev, {T, E});
  // Memory-bound: with E outputs per token the product does too little arithmetic per byte
  // it reads to be limited by the GEMM rate.
  table.add({"router matmul (T,H)x(H,E)",
             timed([&] { matmul(dev, x, false, router, true, logits); }), Bound::kMemory,
             (T * H + E * H + T * E) * f32});

  Tensor probs = device_tensor(dev, {T, E});
  Tensor expert_ids = device_tensor(dev, {T, K}, DType::kI32);
  Tensor weights = device_tensor(dev, {T, K});
  table.add({"gating_forward", timed([&] {
               gating_forward(dev, logits, static_cast<int>(K), true, probs, expert_ids, weights);
             }),
             Bound::kMemory, 2 * T * E * f32 + T * K * (i32 + f32)});

  Tensor counts = device_tensor(dev, {E}, DType::kI32);
  Tensor dest_rows = device_tensor(dev, {T, K}, DType::kI32);
  table.add({"permute_plan", timed([&] {
               permute_plan(dev, expert_ids, weights, static_cast<int>(E), -1, counts, dest_rows);
             }),
             Bound::kMemory, T * K * (2 * i32 + f32)});
  const Tensor group_sizes = counts.on_host();  // the grouped GEMMs take host sizes

  const int64_t R = T * K;  // dropless: every assignment gets a row
  Tensor xp = device_tensor(dev, {R, H});
  table.add({"permute_gather", timed([&] { permute_gather(dev, x, dest_rows, xp); }),
             Bound::kMemory, (T * H + R * H) * f32 + T * K * i32});

  Tensor w_gate_up = random_tensor(dev, {E, 2 * F, H});
  Tensor gate_up = device_tensor(dev, {R, 2 * F});
  table.add({"grouped_matmul_nt gate_up",
             timed([&] { grouped_matmul_nt(dev, xp, w_gate_up, group_sizes, gate_up); }),
             Bound::kCompute, 2.0 * R * H * 2 * F});

  Tensor act = device_tensor(dev, {R, F});
  table.add({"swiglu_forward", timed([&] { swiglu_forward(dev, gate_up, act); }), Bound::kMemory,
             3 * R * F * f32});

  Tensor w_down = random_tensor(dev, {E, H, F});
  Tensor yp = device_tensor(dev, {R, H});
  table.add({"grouped_matmul_nt down",
             timed([&] { grouped_matmul_nt(dev, act, w_down, group_sizes, yp); }), Bound::kCompute,
             2.0 * R * F * H});

  Tensor y = device_tensor(dev, {T, H});
  table.add({"unpermute_combine", timed([&] { unpermute_combine(dev, yp, dest_rows, weights, y); }),
             Bound::kMemory, (R * H + T * H) * f32 + T * K * (i32 + f32)});

  // The backward of the down projection: the input gradient and the weight gradient.
  Tensor dact = device_tensor(dev, {R, F});
  table.add({"grouped_matmul_nn down (dx)",
             timed([&] { grouped_matmul_nn(dev, yp, w_down, group_sizes, dact); }), Bound::kCompute,
             2.0 * R * H * F});
  Tensor dw_down = device_tensor(dev, {E, H, F});
  dw_down.zero_();
  table.add({"grouped_matmul_tn_acc down (dw)",
             timed([&] { grouped_matmul_tn_accumulate(dev, yp, act, group_sizes, dw_down); }),
             Bound::kCompute, 2.0 * R * H * F});

  {
    const int64_t B = T / o.seq, S = o.seq, NH = o.heads, KV = o.kv_heads, D = H / NH;
    Tensor q = random_tensor(dev, {B, S, NH, D});
    Tensor k = random_tensor(dev, {B, S, KV, D});
    Tensor v = random_tensor(dev, {B, S, KV, D});
    Tensor out = device_tensor(dev, {B, S, NH, D});
    Tensor lse = device_tensor(dev, {B, NH, S});
    // Causal: the score and value products over the lower triangle only.
    const double forward_flops = 2.0 * 2.0 * B * NH * D * (S * (S + 1) / 2.0);
    table.add({"attention_forward (causal)",
               timed([&] { attention_forward(dev, q, k, v, out, lse); }), Bound::kCompute,
               forward_flops});
    Tensor dout = random_tensor(dev, {B, S, NH, D});
    Tensor dq = device_tensor(dev, {B, S, NH, D});
    Tensor dk = device_tensor(dev, {B, S, KV, D});
    Tensor dv = device_tensor(dev, {B, S, KV, D});
    // Four products (dv, dp, dq, dk): twice the forward (the probabilities it recomputes
    // from the saved log-sum-exp are not counted).
    table.add({"attention_backward (causal)",
               timed([&] { attention_backward(dev, dout, q, k, v, out, lse, dq, dk, dv); }),
               Bound::kCompute, 2 * forward_flops});
  }
  {
    const int64_t V = o.vocab;
    Tensor vocab_logits = random_tensor(dev, {T, V});
    Tensor targets_host = Tensor::empty({T}, DType::kI32);
    Rng rng(2);
    for (int64_t t = 0; t < T; ++t)
      targets_host.data<int32_t>()[t] = static_cast<int32_t>(rng.below(V));
    Tensor targets = targets_host.to(dev);
    Tensor losses = device_tensor(dev, {T});
    Tensor lse = device_tensor(dev, {T});
    table.add({"cross_entropy_forward",
               timed([&] { cross_entropy_forward(dev, vocab_logits, targets, losses, lse); }),
               Bound::kMemory, T * V * f32});
    Tensor dlogits = device_tensor(dev, {T, V});
    table.add({"cross_entropy_backward", timed([&] {
                 cross_entropy_backward(dev, vocab_logits, targets, lse, 1.0f / T, dlogits);
               }),
               Bound::kMemory, 2 * T * V * f32});
  }
  {
    const int64_t N = o.adamw_elements;
    Tensor param = random_tensor(dev, {N});
    Tensor grad = random_tensor(dev, {N});
    Tensor exp_avg = device_tensor(dev, {N});
    Tensor exp_avg_sq = device_tensor(dev, {N});
    exp_avg.zero_();
    exp_avg_sq.zero_();
    const AdamWHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    // Reads param, grad and both moments; writes param and both moments.
    table.add({"adamw_step " + std::to_string(N / 1'000'000) + "M",
               timed([&] { adamw_step(dev, h, 1.0f, param, grad, exp_avg, exp_avg_sq); }),
               Bound::kMemory, 7 * N * f32});
  }
}

// Expert sizes summing to `rows` over `experts`: balanced (rows / experts each, one more
// for the first rows % experts), or skewed (half of the rows to the first expert, the
// rest balanced over the others), as a router that favours one expert gives.
Tensor expert_sizes(int64_t rows, int64_t experts, bool skewed) {
  Tensor sizes = Tensor::empty({experts}, DType::kI32);
  int32_t* s = sizes.data<int32_t>();
  const int64_t first = skewed && experts > 1 ? rows / 2 : 0;
  const int64_t others = skewed && experts > 1 ? experts - 1 : experts;
  for (int64_t e = 0; e < others; ++e)
    s[experts - others + e] =
        static_cast<int32_t>((rows - first) / others + (e < (rows - first) % others ? 1 : 0));
  if (others < experts) s[0] = static_cast<int32_t>(first);
  return sizes;
}

// The expert GEMMs of one MoE layer (forward gate_up and down, the down projection's
// input and weight gradients) on bf16 operands, each timed three ways: the public op,
// which runs the engine's tensor-core kernel with the sizes on the device; the
// per-expert cuBLASLt loop (cuda::grouped_matmul_*, one cublasLtMatmul per expert, sizes
// on the host); and one cublasGemmGroupedBatchedEx call (cuda::grouped_batched_matmul_*,
// sizes on the host). Results are bf16, the weight gradient f32 (accumulated), as in
// training; cuBLAS has no grouped batched GEMM from bf16 to f32, so for the weight
// gradient that call runs the loop (marked *). TFLOP/s are against the bf16 cuBLAS GEMM
// ceiling; the ratios are loop time / kernel time and grouped time / kernel time (above
// 1: the kernel is faster).
nlohmann::ordered_json measure_grouped_bf16(CudaDevice& dev, const Options& o, const Ceilings& c) {
  const int64_t T = o.tokens, H = o.hidden, E = o.experts, F = o.ffn;
  const int64_t R = T * o.top_k;
  auto timed = [&](const std::function<void()>& op) { return median_ms(dev, o.reps, op); };
  constexpr DType bf = DType::kBF16;
  Tensor xp = random_tensor(dev, {R, H}, bf);
  Tensor act = random_tensor(dev, {R, F}, bf);
  Tensor dy = random_tensor(dev, {R, H}, bf);
  Tensor w_gate_up = random_tensor(dev, {E, 2 * F, H}, bf);
  Tensor w_down = random_tensor(dev, {E, H, F}, bf);
  Tensor gate_up = device_tensor(dev, {R, 2 * F}, bf);
  Tensor y = device_tensor(dev, {R, H}, bf);
  Tensor dact = device_tensor(dev, {R, F}, bf);
  Tensor dw_down = device_tensor(dev, {E, H, F});
  dw_down.zero_();
  const cuda::GemmTypes bf16_out{CUDA_R_16BF, CUDA_R_16BF}, f32_out{CUDA_R_16BF, CUDA_R_32F};
  cuda::Blas& blas = dev.blas();

  std::printf(
      "\ngrouped expert GEMMs, bf16 operands: the engine's kernel, the per-expert cuBLASLt "
      "loop and one cuBLAS grouped batched call (%% of the bf16 cuBLAS GEMM; * runs the "
      "loop: no bf16 -> f32 grouped batched GEMM)\n");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (bool skewed : {false, true}) {
    const Tensor host_sizes = expert_sizes(R, E, skewed);
    const Tensor sizes = host_sizes.to(dev);
    const int32_t* hs = host_sizes.data<int32_t>();
    struct Product {
      std::string name;
      double flops;
      cuda::GemmTypes types;
      std::function<void()> kernel, loop, grouped;
    };
    const std::vector<Product> products = {
        {"nt gate_up", 2.0 * R * H * 2 * F, bf16_out,
         [&] { grouped_matmul_nt(dev, xp, w_gate_up, sizes, gate_up); },
         [&] {
           cuda::grouped_matmul_nt(blas, xp.raw_data(), w_gate_up.raw_data(), hs, E, 2 * F, H,
                                   gate_up.raw_data(), bf16_out);
         },
         [&] {
           cuda::grouped_batched_matmul_nt(blas, xp.raw_data(), w_gate_up.raw_data(), hs, E, 2 * F,
                                           H, gate_up.raw_data(), bf16_out);
         }},
        {"nt down", 2.0 * R * F * H, bf16_out,
         [&] { grouped_matmul_nt(dev, act, w_down, sizes, y); },
         [&] {
           cuda::grouped_matmul_nt(blas, act.raw_data(), w_down.raw_data(), hs, E, H, F,
                                   y.raw_data(), bf16_out);
         },
         [&] {
           cuda::grouped_batched_matmul_nt(blas, act.raw_data(), w_down.raw_data(), hs, E, H, F,
                                           y.raw_data(), bf16_out);
         }},
        {"nn down (dx)", 2.0 * R * H * F, bf16_out,
         [&] { grouped_matmul_nn(dev, dy, w_down, sizes, dact); },
         [&] {
           cuda::grouped_matmul_nn(blas, dy.raw_data(), w_down.raw_data(), hs, E, H, F,
                                   dact.raw_data(), bf16_out);
         },
         [&] {
           cuda::grouped_batched_matmul_nn(blas, dy.raw_data(), w_down.raw_data(), hs, E, H, F,
                                           dact.raw_data(), bf16_out);
         }},
        {"tn_acc down (dw)", 2.0 * R * H * F, f32_out,
         [&] { grouped_matmul_tn_accumulate(dev, dy, act, sizes, dw_down); },
         [&] {
           cuda::grouped_matmul_tn_accumulate(blas, dy.raw_data(), act.raw_data(), hs, E, H, F,
                                              dw_down.raw_data(), f32_out);
         },
         [&] {
           cuda::grouped_batched_matmul_tn_accumulate(blas, dy.raw_data(), act.raw_data(), hs, E, H,
                                                      F, dw_down.raw_data(), f32_out);
         }},
    };
    for (const Product& p : products) {
      const double kernel_ms = timed(p.kernel), loop_ms = timed(p.loop);
      const double grouped_ms = timed(p.grouped);
      const bool grouped_runs_loop = !cuda::grouped_batched_supports(p.types);
      auto tflops = [&](double ms) { return p.flops / (ms * 1e-3) / 1e12; };
      auto pct = [&](double ms) { return 100 * tflops(ms) / c.bf16_tflops; };
      const std::string label = p.name + (skewed ? " skewed" : " balanced");
      std::printf(
          "%-28s kernel %8.3f ms %7.1f TFLOP/s %5.1f%% | cuBLAS loop %8.3f ms %7.1f "
          "TFLOP/s %5.1f%% | cuBLAS grouped%s %8.3f ms %7.1f TFLOP/s %5.1f%% | ratios %.2f "
          "%.2f\n",
          label.c_str(), kernel_ms, tflops(kernel_ms), pct(kernel_ms), loop_ms, tflops(loop_ms),
          pct(loop_ms), grouped_runs_loop ? "*" : "", grouped_ms, tflops(grouped_ms),
          pct(grouped_ms), loop_ms / kernel_ms, grouped_ms / kernel_ms);
      std::fflush(stdout);
      rows.push_back({{"op", p.name},
                      {"sizes", skewed ? "skewed" : "balanced"},
                      {"kernel_ms", kernel_ms},
                      {"kernel_tflops", tflops(kernel_ms)},
                      {"kernel_pct_of_bf16_gemm", pct(kernel_ms)},
                      {"cublas_loop_ms", loop_ms},
                      {"cublas_loop_tflops", tflops(loop_ms)},
                      {"cublas_loop_pct_of_bf16_gemm", pct(loop_ms)},
                      {"cublas_loop_over_kernel_time", loop_ms / kernel_ms},
                      {"cublas_grouped_ms", grouped_ms},
                      {"cublas_grouped_tflops", tflops(grouped_ms)},
                      {"cublas_grouped_pct_of_bf16_gemm", pct(grouped_ms)},
                      {"cublas_grouped_over_kernel_time", grouped_ms / kernel_ms},
                      {"cublas_grouped_runs_loop", grouped_runs_loop}});
    }
  }
  return rows;
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  using namespace switchyard;
  Options o;
  CLI::App app{"GPU op benchmark: ceilings and the hot ops of a Mixtral-shaped MoE layer"};
  app.add_option("--hidden", o.hidden, "hidden size");
  app.add_option("--experts", o.experts, "experts");
  app.add_option("--top-k", o.top_k, "experts per token");
  app.add_option("--ffn", o.ffn, "expert FFN hidden size");
  app.add_option("--tokens", o.tokens, "tokens (batch x seq)");
  app.add_option("--heads", o.heads, "attention heads");
  app.add_option("--kv-heads", o.kv_heads, "KV heads");
  app.add_option("--seq", o.seq, "sequence length (divides --tokens)");
  app.add_option("--vocab", o.vocab, "vocabulary size");
  app.add_option("--adamw-elements", o.adamw_elements, "elements AdamW updates");
  app.add_option("--gemm-size", o.gemm_size, "size of the square ceiling GEMMs");
  app.add_option("--reps", o.reps, "timed repetitions per item (the median is reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.tokens % o.seq != 0 || o.hidden % o.heads != 0 || o.heads % o.kv_heads != 0) {
    std::fprintf(stderr,
                 "gpu_ops: --seq must divide --tokens, --heads --hidden, --kv-heads --heads\n");
    return 2;
  }
  if (cuda_device_count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }

  CudaDevice dev(0);
  cudaDeviceProp prop;
  SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const Peak peak = gpu_peak(dev, 1);
  const double spec_bf16_tflops = peak.flops / 1e12;
  std::printf("device: %s, %d SMs; bf16 peak the trainer uses: %.0f TFLOP/s (%s)\n", prop.name,
              prop.multiProcessorCount, spec_bf16_tflops, peak.source.c_str());
  std::printf(
      "shape: tokens %lld, hidden %lld, %lld experts top-%lld, expert ffn %lld, heads %lld "
      "(kv %lld), seq %lld, vocab %lld; median of %d repetitions\n",
      static_cast<long long>(o.tokens), static_cast<long long>(o.hidden),
      static_cast<long long>(o.experts), static_cast<long long>(o.top_k),
      static_cast<long long>(o.ffn), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), static_cast<long long>(o.seq),
      static_cast<long long>(o.vocab), o.reps);
  std::fflush(stdout);

  const Ceilings ceilings = measure_ceilings(dev, o);
  Table table(ceilings);
  measure_ops(dev, o, table);
  const nlohmann::ordered_json grouped_bf16 = measure_grouped_bf16(dev, o, ceilings);

  nlohmann::ordered_json result = {{"bench", "gpu_ops"},
                                   {"device", prop.name},
                                   {"shape",
                                    {{"tokens", o.tokens},
                                     {"hidden", o.hidden},
                                     {"experts", o.experts},
                                     {"top_k", o.top_k},
                                     {"ffn", o.ffn},
                                     {"heads", o.heads},
                                     {"kv_heads", o.kv_heads},
                                     {"seq", o.seq},
                                     {"vocab", o.vocab}}},
                                   {"copy_gbs", ceilings.copy_gbs},
                                   {"fp32_gemm_tflops", ceilings.fp32_tflops},
                                   {"bf16_gemm_tflops", ceilings.bf16_tflops},
                                   {"bf16_spec_tflops", spec_bf16_tflops},
                                   {"ops", table.json()},
                                   {"grouped_bf16", grouped_bf16}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
