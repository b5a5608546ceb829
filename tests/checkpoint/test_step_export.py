"""`convert to-hf` of a checkpoints/step_N of any layout: the slices of a tensor-, expert-
and data-parallel ZeRO-1 run (4 ranks: tp 2, ep 2, dp 2) are gathered on one process,
and the export equals, tensor for tensor, the export of the final weights of the same
run stopped at that step; a two-stage pipeline run's step_N, each stage's slices in a
file of its own, exports as one process's step_N. The model has OLMoE's q/k norm, so the
export is an OlmoeForCausalLM directory.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json

import numpy as np
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

# A constant learning rate without warmup: the first two steps of a 4-step run are those
# of a 2-step run.
SETS = ["model.num_layers=2", "train.seq_len=32", "train.global_batch_size=4",
        "train.micro_batch_size=1", "optimizer.decay=CONSTANT", "optimizer.warmup_steps=0",
        "train.eval_interval=0", "train.log_interval=1", "checkpoint.interval_steps=2",
        "checkpoint.keep=0", "model.qk_norm=true"]
TP_EP_ZERO1 = ["parallel.tensor_parallel_size=2", "parallel.expert_parallel_size=2",
               "parallel.zero_stage=1"]


def train(run_dir, cache, steps, layout=TP_EP_ZERO1, ranks=4):
    args = [SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, "--dataset-cache", cache,
            "--set", f"train.steps={steps}"]
    for s in SETS + layout:
        args += ["--set", s]
    return run_dir / "checkpoints", run(args, ranks=ranks, threads=1, timeout=600).stdout


def export(weights, out):
    run([SWITCHYARD, "convert", "to-hf", weights, out], threads=1, timeout=600)
    return load_file(str(out / "model.safetensors"))


def test_step_checkpoint_exports_as_the_final_weights_of_that_step(tmp_path):
    longer, out = train(tmp_path / "four", tmp_path / "cache", 4)
    assert "; 4 ranks (dp 2, tp 2, ep 2" in out
    stopped, _ = train(tmp_path / "two", tmp_path / "cache", 2)
    step = export(longer / "step_2", tmp_path / "hf-step2")
    final = export(stopped / "final", tmp_path / "hf-final")
    assert set(step) == set(final)
    for name, value in final.items():
        np.testing.assert_array_equal(step[name], value, err_msg=name)
    for name in ("config.json", "tokenizer.model", "tokenizer_config.json"):
        assert (tmp_path / "hf-step2" / name).read_bytes() == (tmp_path / "hf-final" / name).read_bytes()
    assert json.loads((tmp_path / "hf-step2/config.json").read_text())["architectures"] == [
        "OlmoeForCausalLM"]
    # The 4-step run went on after step 2: the export read step 2, not its end.
    later = export(longer / "final", tmp_path / "hf-step4")
    assert any(not np.array_equal(later[name], value) for name, value in step.items())


def test_pipeline_step_checkpoint_exports_as_one_process_step(tmp_path):
    """Two stages train one process's weights bit for bit under runtime.batch_invariant
    (docs/determinism.md: a stage rank computes with fewer threads than one process, and
    OpenBLAS's order follows the thread count), so their step_2, whose rank files each
    hold one stage's layers, exports exactly as one process's step_2."""
    invariant = ["runtime.batch_invariant=true"]
    staged, _ = train(tmp_path / "staged", tmp_path / "cache", 4,
                      ["parallel.pipeline_parallel_size=2", *invariant], ranks=2)
    single, _ = train(tmp_path / "single", tmp_path / "cache", 4, invariant, ranks=1)
    assert sorted(p.name for p in (staged / "step_2").glob("rank_*.h5")) == ["rank_0.h5",
                                                                            "rank_1.h5"]
    step = export(staged / "step_2", tmp_path / "hf-staged")
    reference = export(single / "step_2", tmp_path / "hf-single")
    assert set(step) == set(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(step[name], value, err_msg=name)
    for name in ("config.json", "tokenizer.model", "tokenizer_config.json"):
        assert (tmp_path / "hf-staged" / name).read_bytes() == (
            tmp_path / "hf-single" / name).read_bytes()
