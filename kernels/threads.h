// CPU threading for the kernels (OpenMP loops and OpenBLAS GEMMs).
#pragma once

namespace switchyard {

// Sets the threads used by CPU kernels; 0 means one per core.
void set_cpu_threads(int threads);
int cpu_threads();

}  // namespace switchyard
