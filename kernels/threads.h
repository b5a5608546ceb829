// CPU kernel settings: threading (OpenMP loops and OpenBLAS GEMMs) and the order of the
// matrix products' sums.
#pragma once

namespace switchyard {

// Sets the threads used by CPU kernels; 0 means one per core.
void set_cpu_threads(int threads);
int cpu_threads();

// runtime.batch_invariant: whether the CPU matrix products add in one fixed order
// (kernels/cpu/fixed_order_gemm.h) instead of OpenBLAS's, whose order follows the call's
// shape, the thread count and the CPU. Off by default.
void set_batch_invariant(bool on);
bool batch_invariant();

// Debian's OpenBLAS (0.3.21) does not recognise every recent x86 CPU: on a Sapphire
// Rapids VM it falls back to its generic SSE3 ("Prescott") kernels, at a fifth of the
// sgemm speed of its AVX-512 ones. OpenBLAS picks its kernels when it loads, from
// OPENBLAS_CORETYPE when that is set. So when it picked the kernels of an older CPU
// than this one and the environment did not choose, this sets OPENBLAS_CORETYPE to the
// kernels the CPU runs (SkylakeX with AVX-512, Haswell with AVX2 and FMA) and
// re-executes the program with the same arguments; it returns when nothing needs to
// change. Call it first in main, before anything else starts (threads, MPI).
void use_fastest_blas_kernels(char** argv);

}  // namespace switchyard
