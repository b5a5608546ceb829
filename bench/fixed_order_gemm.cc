// What runtime.batch_invariant costs in matrix products: the fixed-order kernel
// (kernels/cpu/fixed_order_gemm.h) against OpenBLAS's sgemm on the same operands, at the
// tiny recipe's product shapes and a larger one, best of several runs each, on all
// threads (or the count given as the first argument). Prints one JSON line per shape:
//   {"m": M, "n": N, "k": K, "trans_a": 0|1, "trans_b": 0|1, "fixed_gflops": F,
//    "blas_gflops": B, "fixed_over_blas": F / B}
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/threads.h"

namespace {

struct Shape {
  int m, n, k;
  bool trans_a, trans_b;
};

// tiny.textproto (hidden 128, experts' hidden 256, vocab 1024) on a micro-batch of
// 8 x 128 tokens: a projection, an expert's up and down products, a weight gradient
// over the tokens, the LM head; then a product eight times larger.
constexpr Shape kShapes[] = {{1024, 128, 128, false, true}, {1024, 256, 128, false, true},
                             {1024, 128, 256, false, false}, {128, 256, 1024, true, false},
                             {1024, 1024, 128, false, true}, {2048, 1024, 512, false, true}};
constexpr int kRuns = 5;

// Best GFLOP/s of kRuns products in the current mode, after one untimed warmup.
double best_gflops(const Shape& s, const std::vector<float>& a, const std::vector<float>& b,
                   std::vector<float>& c) {
  const int lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
  double best = 0;
  for (int run = 0; run <= kRuns; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    switchyard::cpu::gemm<float>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda,
                                 b.data(), ldb, 0.0f, c.data(), s.n);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (run > 0) best = std::max(best, 2.0 * s.m * s.n * s.k / t / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  switchyard::use_fastest_blas_kernels(argv);
  switchyard::set_cpu_threads(argc > 1 ? std::atoi(argv[1]) : 0);
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : kShapes) {
    std::vector<float> a(static_cast<size_t>(s.m) * s.k), b(static_cast<size_t>(s.k) * s.n),
        c(static_cast<size_t>(s.m) * s.n);
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
    switchyard::set_batch_invariant(false);
    const double blas = best_gflops(s, a, b, c);
    switchyard::set_batch_invariant(true);
    const double fixed = best_gflops(s, a, b, c);
    std::printf(
        "{\"m\": %d, \"n\": %d, \"k\": %d, \"trans_a\": %d, \"trans_b\": %d, "
        "\"fixed_gflops\": %.2f, \"blas_gflops\": %.2f, \"fixed_over_blas\": %.3f}\n",
        s.m, s.n, s.k, s.trans_a, s.trans_b, fixed, blas, fixed / blas);
  }
  return 0;
}
