"""Layout equivalence on GPUs: under mpirun each rank takes its own GPU and the groups
communicate over NCCL; losses and final weights must match one process on one GPU, as
on the CPU (tests/parallel/test_train_equivalence.py, whose runs and tolerances this
reuses). Needs as many GPUs as the largest layout's ranks: on a machine with fewer every
test is skipped, and ctest reports the file as skipped.

Run by ctest (label gpu) with the interop Python; SWITCHYARD and MPIEXEC name the
binaries.
"""
import shutil
import subprocess

import pytest

from test_train_equivalence import LAYOUTS, assert_run_matches, train


def visible_gpus():
    if shutil.which("nvidia-smi") is None:
        return 0
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in result.stdout.splitlines())


GPU_LAYOUTS = ["dp2", "ep2", "tp2", "tp2xep2", "dp2-zero1", "dp2-zero3"]
NEEDED = max(LAYOUTS[name][0] for name in GPU_LAYOUTS)
pytestmark = pytest.mark.skipif(visible_gpus() < NEEDED,
                                reason=f"fewer than {NEEDED} GPUs visible")

# fp32, as the CPU comparisons are (a GPU run is bf16 unless told otherwise).
CUDA = ["--set", "runtime.device=cuda", "--set", "runtime.precision=fp32"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("gpu"), "single", 1, CUDA)


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_gpu_layout_matches_single_gpu(tmp_path, single, layout):
    single_losses, single_weights = single
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + CUDA)
    assert_run_matches(losses, weights, single_losses, single_weights)
