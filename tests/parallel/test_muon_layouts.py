"""Muon (optimizer.algorithm MUON) in one process and under every layout: Muon's momentum
for the hidden matrices and AdamW's moments for the rest in the checkpoints, a resume that
continues bit for bit (in one process and across layouts), and data, expert and ZeRO 1-3
parallelism and pipeline stages giving one process's bits under runtime.batch_invariant
(tensor parallelism: to rounding), each matrix orthogonalised whole by one rank.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import shutil

import h5py
import pytest
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, rewind, run
from test_train_equivalence import (COMMON, LAYOUTS, RECIPE, STEPS, assert_run_matches,
                                    logged_losses, train)

MUON = ["--set", "optimizer.algorithm=MUON", "--set", "checkpoint.interval_steps=2",
        "--set", "checkpoint.keep=5"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    return root, train(root, "single", 1, MUON)


def saved_names(checkpoint):
    names = []
    for path in sorted(checkpoint.glob("rank_*.h5")):
        with h5py.File(path) as saved:
            saved.visit(names.append)
    return set(names)


def test_muon_keeps_a_momentum_for_matrices_and_adamw_moments_for_the_rest(single):
    root, _ = single
    names = saved_names(root / "single" / "checkpoints" / f"step_{STEPS}")
    layer = "model.layers.0."
    for matrix in ("self_attn.q_proj.weight", "self_attn.o_proj.weight",
                   "mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
        assert f"muon_momentum/{layer}{matrix}" in names, matrix
        assert f"exp_avg/{layer}{matrix}" not in names, matrix
    for other in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                  f"{layer}mlp.gate.weight", f"{layer}input_layernorm.weight"):
        assert f"exp_avg/{other}" in names and f"exp_avg_sq/{other}" in names, other
        assert f"muon_momentum/{other}" not in names, other


def test_muon_trains_otherwise_than_adamw(tmp_path, single):
    _, (losses, weights) = single
    adamw_losses, adamw_weights = train(tmp_path, "adamw", 1)
    assert losses[0, 0] == adamw_losses[0, 0]  # the same start
    assert losses[-1, 0] < losses[0, 0]  # learning
    name = "model.layers.0.self_attn.q_proj.weight"
    assert weights[name].tobytes() != adamw_weights[name].tobytes()


def resume(tmp_path, single, step, ranks, overrides):
    """The single run's directory rewound to step_<step>, resumed under a layout."""
    root, _ = single
    run_dir = tmp_path / "resumed"
    shutil.copytree(root / "single", run_dir)
    rewind(run_dir, step)
    out = run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, "--dataset-cache",
               root / "datasets", *COMMON, *MUON, *overrides], ranks=ranks, timeout=600)
    assert f"(step {step})" in out.stdout and "resuming from" in out.stdout, out.stdout
    return run_dir


@pytest.mark.parametrize("layout", ["single", "dp2-zero1", "ep2", "dp2-zero3"])
def test_resume_continues_bit_for_bit(tmp_path, single, layout):
    """Saved by one process at step 2, resumed in one process or resharded onto another
    layout: the momentum comes back and the run goes on as it did."""
    _, (losses, weights) = single
    ranks, overrides = (1, []) if layout == "single" else LAYOUTS[layout]
    run_dir = resume(tmp_path, single, 2, ranks, overrides)
    resumed = load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))
    assert_run_matches(logged_losses(run_dir), resumed, losses, weights, overrides)


def test_resume_refuses_another_algorithm(tmp_path, single):
    root, _ = single
    shutil.copytree(root / "single", tmp_path / "run")
    rewind(tmp_path / "run", 2)
    out = run([SWITCHYARD, "train", RECIPE, "--run-dir", tmp_path / "run", "--dataset-cache",
               root / "datasets", *COMMON], expect=1)
    assert "other optimizer.algorithm settings" in out.stderr, out.stderr


MUON_LAYOUTS = dict(
    {name: LAYOUTS[name] for name in ("dp2", "dp2-zero1", "ep2", "dp2xep2-zero1", "dp2-zero2",
                                      "dp2-zero3", "dp2xep2-zero3", "tp2", "dp2xtp2-zero3")},
    pp2=(2, ["--set", "parallel.pipeline_parallel_size=2"]))


@pytest.mark.parametrize("layout", MUON_LAYOUTS)
def test_layout_matches_single_process(tmp_path, single, layout):
    _, (single_losses, single_weights) = single
    ranks, overrides = MUON_LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, MUON + overrides)
    assert_run_matches(losses, weights, single_losses, single_weights, overrides)
