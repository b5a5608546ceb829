"""Layout equivalence on GPUs: under mpirun each rank takes its own GPU and the groups
communicate over NCCL; losses and final weights must match one process on one GPU, as
on the CPU (tests/parallel/test_train_equivalence.py, whose runs and tolerances this
reuses). Pipeline stages send their activations, gradients and (under the all-layer aux
loss) routing sums with ncclSend/ncclRecv. Needs 2 GPUs, and a layout as many as its
ranks: on a machine with fewer every test is skipped, and ctest reports the file as
skipped (NCCL refuses two ranks of one communicator on one GPU).

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
PP2 = ["--set", "parallel.pipeline_parallel_size=2"]
PIPELINE_LAYOUTS = {  # name: (ranks, overrides); the schedule is ONE_F_ONE_B unless set
    "pp2": (2, PP2),
    "pp2-gpipe": (2, [*PP2, "--set", "parallel.pipeline_schedule=GPIPE"]),
    "pp2xdp2": (4, PP2),
}
GPUS = visible_gpus()
NEEDED = max(LAYOUTS[name][0] for name in GPU_LAYOUTS)
pytestmark = pytest.mark.skipif(GPUS < NEEDED, reason=f"fewer than {NEEDED} GPUs visible")

# fp32, as the CPU comparisons are (a GPU run is bf16 unless told otherwise), without the
# CPU comparisons' batch-invariant products, which have no GPU kernels.
CUDA = ["--set", "runtime.device=cuda", "--set", "runtime.precision=fp32",
        "--set", "runtime.batch_invariant=false"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("gpu"), "single", 1, CUDA)


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_gpu_layout_matches_single_gpu(tmp_path, single, layout):
    single_losses, single_weights = single
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + CUDA)
    assert_run_matches(losses, weights, single_losses, single_weights)


def train_pipeline(tmp_path, layout, extra):
    """A pipeline layout's run, skipped where it has fewer GPUs than ranks."""
    ranks, overrides = PIPELINE_LAYOUTS[layout]
    if GPUS < ranks:
        pytest.skip(f"{layout} needs {ranks} GPUs, {GPUS} visible")
    return train(tmp_path, layout, ranks, overrides + extra + CUDA)


@pytest.mark.parametrize("layout", PIPELINE_LAYOUTS)
def test_gpu_pipeline_matches_single_gpu(tmp_path, single, layout):
    losses, weights = train_pipeline(tmp_path, layout, [])
    assert_run_matches(losses, weights, *single)


# Transformers' aux loss over all layers: every stage message carries the routing sums
# beside its tensor, on the GPU.
ALL_LAYER = ["--set", "moe.aux_loss_per_layer=false"]


@pytest.fixture(scope="module")
def single_all_layer(tmp_path_factory):
    return train(tmp_path_factory.mktemp("gpu_all_layer"), "single", 1, ALL_LAYER + CUDA)


@pytest.mark.parametrize("layout", PIPELINE_LAYOUTS)
def test_gpu_pipeline_with_routing_sums_matches_single_gpu(tmp_path, single_all_layer, layout):
    losses, weights = train_pipeline(tmp_path, layout, ALL_LAYER)
    assert_run_matches(losses, weights, *single_all_layer)
