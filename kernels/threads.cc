#include "kernels/threads.h"

#include <cblas.h>
#include <omp.h>

#include <thread>

namespace switchyard {

void set_cpu_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
}

int cpu_threads() { return omp_get_max_threads(); }

}  // namespace switchyard
