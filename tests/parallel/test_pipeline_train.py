"""Pipeline layouts in `switchyard train`: every rank holds every layer, so a layout of
more than one pipeline stage is refused in one line before any work (docs/pipeline.md).

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import subprocess

from test_train_equivalence import COMMON, ENV, RECIPE, SWITCHYARD, mpirun


def test_pipeline_stages_are_refused_before_any_work(tmp_path):
    result = subprocess.run(
        mpirun(2) + [SWITCHYARD, "train", RECIPE, "--run-dir", str(tmp_path / "run"), *COMMON,
                     "--set", "parallel.pipeline_parallel_size=2"],
        capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode != 0
    assert "parallel.pipeline_parallel_size (2) must be 1: train runs every layer" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_pipeline_size_that_does_not_divide_the_world_is_refused(tmp_path):
    result = subprocess.run(
        mpirun(2) + [SWITCHYARD, "train", RECIPE, "--run-dir", str(tmp_path / "run"), *COMMON,
                     "--set", "parallel.pipeline_parallel_size=3", "--set", "model.num_layers=3"],
        capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode != 0
    assert "parallel.pipeline_parallel_size (3) must divide the world size (2)" in result.stderr
