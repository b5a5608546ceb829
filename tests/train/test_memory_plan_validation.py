"""The memory plan (`train --dry-run`, `plan`) against what a real run allocates: for each
configuration (the tiny recipe, or deepseek-v3-tiny for latent attention), rank 0's planned parameters (with their working copies), gradients (with
ZeRO's buckets), optimizer state and activations (with all-to-all buffers) against the
peaks of each category its first step records in metrics.jsonl. The plan counts the
allocations the model code makes, so the only gaps are the few small tensors it does not
follow (a CPU run's ids and rope table live outside the activation count) and, for
activations, routing: the plan assumes balanced routing, which expert-parallel runs here
force (moe.router_force_balance; expert choice is balanced by construction), since an
unbalanced router moves rows between ranks.
TOLERANCE covers those small tensors with room; a model term left out (one saved tensor
per layer) misses by more. bf16 activations are not compared: the CPU runs a bf16 op in
f32 on widened copies of its operands (kernels/convert.h), transient copies a GPU never
makes, and the plan counts the GPU's bf16; the other terms are the same on both.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries. Run as a
script, it prints the table of docs/planning.md.
"""
import json
import sys
from pathlib import Path

import pytest

# sy_testing.py is in tests/, which conftest.py puts on the path under pytest but not for a
# run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sy_testing import REPO, SWITCHYARD, run  # noqa: E402

RECIPES = REPO / "recipes"
TOLERANCE = 0.10
# Each run evaluates before its step (eval_interval 1: at step 0), as an ordinary run does,
# one batch of 4 windows: a forward-only pass keeps one layer's tensors at a time, below
# the training step's peak unless its batch is the larger (the evaluation row below).
COMMON = ["train.steps=1", "train.eval_interval=1", "train.eval_tokens=256",
          "train.log_interval=1", "model.num_layers=2", "train.seq_len=64",
          "train.global_batch_size=8", "train.micro_batch_size=4",
          "checkpoint.interval_steps=0"]
BALANCED = ["moe.router_force_balance=true"]

CONFIGS = {  # name: (ranks, overrides[, recipe: tiny unless named])
    "1 rank fp32": (1, []),
    "1 rank bf16": (1, ["runtime.precision=bf16"]),
    "1 rank, micro-batch 8 x 128": (1, ["train.micro_batch_size=8", "train.seq_len=128"]),
    # An evaluation batch (8 windows) larger than the micro-batch: its forward is the peak.
    "1 rank, micro-batch 1, evaluation of 8 windows": (1, ["train.micro_batch_size=1",
                                                           "train.eval_tokens=512"]),
    "1 rank, capacity 1.25": (1, ["moe.capacity_factor=1.25"]),
    "1 rank, 4 layers top-1": (1, ["model.num_layers=4", "moe.top_k=1"]),
    "1 rank, Muon": (1, ["optimizer.algorithm=MUON"]),
    "dp2 zero2, Muon": (2, ["parallel.zero_stage=2", "optimizer.algorithm=MUON"]),
    "1 rank, 2 MTP modules": (1, ["model.mtp_depth=2"]),
    "1 rank, 2 MTP modules, recompute FULL": (1, ["model.mtp_depth=2", "train.recompute=FULL"]),
    "1 rank, gated shared expert": (1, ["moe.num_shared_experts=1",
                                        "moe.shared_expert_ffn_hidden_size=256",
                                        "moe.shared_expert_gate=true"]),
    "1 rank, qk norm": (1, ["model.qk_norm=true"]),
    "1 rank, first layer dense": (1, ["model.first_dense_layers=1",
                                      "model.ffn_hidden_size=256"]),
    "1 rank, expert choice": (1, ["moe.gating=EXPERT_CHOICE", "moe.capacity_factor=1.0"]),
    "dp2 zero1": (2, ["parallel.zero_stage=1"]),
    "dp2 zero2": (2, ["parallel.zero_stage=2"]),
    "dp2 zero3": (2, ["parallel.zero_stage=3"]),
    "dp2 zero3 bf16": (2, ["parallel.zero_stage=3", "runtime.precision=bf16"]),
    "ep2": (2, ["parallel.expert_parallel_size=2"] + BALANCED),
    "ep2, expert choice": (2, ["parallel.expert_parallel_size=2", "moe.gating=EXPERT_CHOICE",
                               "moe.capacity_factor=1.0"]),
    "tp2": (2, ["parallel.tensor_parallel_size=2"]),
    "tp2, per-head qk norm": (2, ["parallel.tensor_parallel_size=2",
                                  "model.qk_head_norm=true"]),
    "tp2 ep2": (2, ["parallel.tensor_parallel_size=2",
                    "parallel.expert_parallel_size=2"] + BALANCED),
    "dp2 ep2 zero1": (4, ["parallel.expert_parallel_size=2", "parallel.zero_stage=1",
                          "train.global_batch_size=16"] + BALANCED),
    "dp2 tp2 zero3": (4, ["parallel.tensor_parallel_size=2", "parallel.zero_stage=3",
                          "train.global_batch_size=16"]),
    "1 rank, recompute SELECTIVE": (1, ["train.recompute=SELECTIVE"]),
    "1 rank, recompute FULL": (1, ["train.recompute=FULL"]),
    "1 rank, 4 layers, FULL first 2": (1, ["model.num_layers=4", "train.recompute=FULL",
                                           "train.recompute_layers=2"]),
    "tp2 ep2, recompute SELECTIVE": (2, ["parallel.tensor_parallel_size=2",
                                         "parallel.expert_parallel_size=2",
                                         "train.recompute=SELECTIVE"] + BALANCED),
    "tp2 ep2, recompute FULL": (2, ["parallel.tensor_parallel_size=2",
                                    "parallel.expert_parallel_size=2",
                                    "train.recompute=FULL"] + BALANCED),
    "dp2 tp2 zero3, recompute FULL": (4, ["parallel.tensor_parallel_size=2",
                                          "parallel.zero_stage=3", "train.global_batch_size=16",
                                          "train.recompute=FULL"]),
    # Latent attention (docs/mla.md): its latents before and after their norms, the
    # padded per-head q, k, v and core output; a dense first layer, shared experts.
    "deepseek-v3-tiny": (1, [], "deepseek-v3-tiny"),
    "deepseek-v3-tiny, recompute SELECTIVE": (1, ["train.recompute=SELECTIVE"],
                                              "deepseek-v3-tiny"),
    "deepseek-v3-tiny tp2": (2, ["parallel.tensor_parallel_size=2"], "deepseek-v3-tiny"),
}

# Planned terms (ranks[0] of the dry run's JSON) and the measured categories they sum to.
TERMS = {
    "parameters": (["parameters", "working_copies"], ["parameters", "expert_parameters"]),
    "gradients": (["gradients", "gradient_buckets"], ["gradients", "expert_gradients"]),
    "optimizer state": (["optimizer_state"], ["optimizer_state", "expert_optimizer_state"]),
    "activations": (["activations", "all_to_all", "pipeline_buffers"], ["activations"]),
}


def config(name):
    """(ranks, overrides, recipe path) of a configuration."""
    ranks, overrides, *recipe = CONFIGS[name]
    return ranks, overrides, str(RECIPES / f"{recipe[0] if recipe else 'tiny'}.textproto")


def sets(overrides):
    return [a for o in COMMON + overrides for a in ("--set", o)]


def planned(recipe, ranks, overrides):
    out = run([SWITCHYARD, "train", recipe, "--dry-run", "--world", ranks, *sets(overrides)],
              timeout=60)
    rank0 = json.loads(out.stdout.splitlines()[-1])["ranks"][0]
    return {t: sum(rank0[k] for k in keys) for t, (keys, _) in TERMS.items()}


def measured(tmp_path, name, recipe, ranks, overrides):
    run_dir = tmp_path / name.replace(" ", "_").replace(",", "")
    run([SWITCHYARD, "train", recipe, "--run-dir", run_dir,
         "--dataset-cache", tmp_path / "datasets", *sets(overrides)], ranks=ranks)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    memory = next(l["memory_bytes"] for l in lines if "memory_bytes" in l)
    return {t: sum(memory[k] for k in keys) for t, (_, keys) in TERMS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_plan_agrees_with_the_measured_peaks(tmp_path, name):
    ranks, overrides, recipe = config(name)
    plan = planned(recipe, ranks, overrides)
    real = measured(tmp_path, name, recipe, ranks, overrides)
    for term in compared(overrides):
        assert real[term] > 0 or term == "optimizer state", (term, real)
        assert abs(plan[term] - real[term]) <= TOLERANCE * real[term], (term, plan, real)


def compared(overrides):
    bf16 = "runtime.precision=bf16" in overrides
    return [t for t in TERMS if not (bf16 and t == "activations")]


def mib(b):
    return f"{b / 2**20:.2f}"


if __name__ == "__main__":
    import tempfile
    print("| configuration | ranks | " + " | ".join(
        f"{t} planned / measured (MiB)" for t in TERMS) + " | worst gap |")
    print("|---|---|" + "---|" * len(TERMS) + "---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONFIGS:
            ranks, overrides, recipe = config(name)
            plan = planned(recipe, ranks, overrides)
            real = measured(Path(tmp), name, recipe, ranks, overrides)
            gap = max(abs(plan[t] - real[t]) / real[t] for t in compared(overrides))
            cells = " | ".join(f"{mib(plan[t])} / {mib(real[t])}" for t in TERMS)
            print(f"| {name} | {ranks} | {cells} | {100 * gap:.1f}% |", flush=True)
