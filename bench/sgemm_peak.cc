// Measures the OpenBLAS sgemm peak that engine MFU is reported against: square
// row-major products C = A @ B at a few sizes, best of several runs each, on all
// threads (or the count given as the first argument). Prints one JSON line:
//   {"sgemm_gflops": BEST, "threads": N, "by_size": {"1024": G, "2048": G, ...}}
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/threads.h"

namespace {

constexpr int kSizes[] = {1024, 2048};
constexpr int kRuns = 5;

// Best GFLOP/s of kRuns products of two n x n matrices, after one untimed warmup.
double best_gflops(int n) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  const double flops = 2.0 * n * n * n;
  double best = 0;
  for (int run = 0; run <= kRuns; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (run > 0) best = std::max(best, flops / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  // The same OpenBLAS kernels as the engine's, so that MFU compares like with like.
  switchyard::use_fastest_blas_kernels(argv);
  int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads);
  double peak = 0;
  std::string by_size;
  for (int n : kSizes) {
    const double g = best_gflops(n);
    peak = std::max(peak, g);
    if (!by_size.empty()) by_size += ", ";
    by_size += "\"" + std::to_string(n) + "\": " + std::to_string(g);
  }
  std::printf("{\"sgemm_gflops\": %.3f, \"threads\": %d, \"by_size\": {%s}}\n", peak, threads,
              by_size.c_str());
  return 0;
}
