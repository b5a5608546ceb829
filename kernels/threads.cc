#include "kernels/threads.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace switchyard {

void set_cpu_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
}

int cpu_threads() { return omp_get_max_threads(); }

namespace {
std::atomic<bool> fixed_order_products{false};
}  // namespace

void set_batch_invariant(bool on) { fixed_order_products.store(on, std::memory_order_relaxed); }
bool batch_invariant() { return fixed_order_products.load(std::memory_order_relaxed); }

void use_fastest_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // chosen by the user, or done
  const char* wanted = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    wanted = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    wanted = "Haswell";
  if (wanted == nullptr) return;
  // Kernel sets older than what this CPU runs; a newer or different one OpenBLAS chose
  // itself (Cooperlake, SapphireRapids, Zen, ...) is left alone.
  static const char* const kOlder[] = {"Prescott", "Core2",       "Penryn",  "Dunnington",
                                       "Nehalem",  "Atom",        "Sandybridge", "Haswell"};
  const char* chosen = openblas_get_corename();
  bool older = false;
  for (const char* name : kOlder)
    older |= chosen != nullptr && std::strcmp(chosen, name) == 0 && std::strcmp(chosen, wanted) != 0;
  if (!older) return;
  setenv("OPENBLAS_CORETYPE", wanted, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "switchyard: could not re-execute with OPENBLAS_CORETYPE=%s\n", wanted);
}

}  // namespace switchyard
