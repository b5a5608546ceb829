"""Hostile inputs of the weights loader `eval`, `sample`, `bench balance` and `convert
to-hf` share (engine/cli/load_model.h): a checkpoint read as weights, a Hugging Face
directory read in memory (see hostile.py for the harness)."""
import math

from cases_hf import NAN_TENSOR, _poke
from hostile import Case


def _eval(weights, world, tmp):
    return ["eval", str(weights), "--data", str(world.dataset(tmp))]


def _step_rank_file_truncated(world, tmp):
    step = world.run_dir(tmp) / "checkpoints" / "step_2"
    rank_file = step / "rank_0.h5"
    with open(rank_file, "r+b") as f:
        f.truncate(rank_file.stat().st_size // 2)
    return _eval(step, world, tmp)


def _step_manifest_garbage(world, tmp):
    step = world.run_dir(tmp) / "checkpoints" / "step_2"
    (step / "manifest.pb").write_bytes(b"\xff" * 64)
    return _eval(step, world, tmp)


def _hf_without_tokenizer(world, tmp):
    hf = world.hf(tmp)
    (hf / "tokenizer.model").unlink()
    return _eval(hf, world, tmp)


def _hf_nan(world, tmp):
    hf = world.hf(tmp)
    _poke(hf / "model.safetensors", NAN_TENSOR, 17, math.nan)
    return _eval(hf, world, tmp)


def _step_as_bench_source(world, tmp):
    step = world.run_dir(tmp) / "checkpoints" / "step_2"
    (step / "manifest.pb").write_bytes(b"")
    return ["bench", "balance", str(step), "--batches", "1"]


CASES = [
    Case("eval-step-rank-file-truncated", "checkpoint read as weights",
         "eval of step_N whose rank file is cut to half its length",
         _step_rank_file_truncated, "rank_0.h5"),
    Case("eval-step-manifest-garbage", "checkpoint read as weights",
         "eval of step_N whose manifest.pb is 64 bytes of 0xff",
         _step_manifest_garbage, "manifest.pb"),
    Case("bench-step-manifest-empty", "checkpoint read as weights",
         "bench balance of step_N whose manifest.pb is empty",
         _step_as_bench_source, "manifest.pb"),
    Case("eval-hf-without-tokenizer", "HF directory read as weights",
         "eval of an HF export whose tokenizer.model is deleted",
         _hf_without_tokenizer, "the model has no tokenizer.model"),
    Case("eval-hf-nan-weight", "HF directory read as weights",
         "eval of an HF export with a NaN weight", _hf_nan, "NaN"),
]
