"""runtime.batch_invariant (docs/determinism.md): every CPU matrix product adds each
output element in one fixed order, so a whole run's bits do not depend on the thread
count (OpenBLAS's threaded products add in an order that does) or on the BLAS kernels
the CPU would pick. (tests/kernels/gemm_test.cc holds the products to a double
reference; the pipeline tests hold stages to one process's bits in this mode.)

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import numpy as np

from test_train_equivalence import train

INVARIANT = ["--set", "runtime.batch_invariant=true"]


def test_thread_count_changes_no_bit(tmp_path):
    one_losses, one_weights = train(tmp_path, "one", 1, INVARIANT + ["--set", "runtime.threads=1"])
    two_losses, two_weights = train(tmp_path, "two", 1, INVARIANT + ["--set", "runtime.threads=2"])
    np.testing.assert_array_equal(two_losses, one_losses)
    assert two_weights.keys() == one_weights.keys()
    for name, value in one_weights.items():
        np.testing.assert_array_equal(two_weights[name], value, err_msg=name)

