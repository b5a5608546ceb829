"""Layout equivalence: a data-, tensor- or expert-parallel run under mpirun trains on the
same tokens per step as the single-process run, so its losses and final weights must
match it (assert_run_matches): bit for bit where runtime.batch_invariant makes every sum
exact (all but tensor parallelism), else to float tolerance up to the first step whose
routing differs. Also: one rank's fatal error ends the whole job quickly with a clear
line.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

STEPS = 4
COMMON = ["--set", f"train.steps={STEPS}", "--set", "optimizer.warmup_steps=1",
          "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
          "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=2",
          "--set", "model.num_layers=2", "--set", "train.seq_len=64",
          "--set", "runtime.batch_invariant=true"]


def train(tmp_path, name, ranks, extra=()):
    run_dir = tmp_path / name
    result = run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir,
                  "--dataset-cache", tmp_path / "datasets", *COMMON, *extra], ranks=ranks)
    # The run saw the world mpirun launched, not a world of one per process.
    assert f"; {ranks} ranks (dp " in result.stdout, result.stdout
    weights = load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))
    return logged_losses(run_dir), weights


class Losses(np.ndarray):
    """Each logged step's loss, aux loss, z-loss and gradient norm, one row a step; its
    `routing` lists each step's routing_digest."""


def logged_losses(run_dir):
    """The Losses of a run's metrics.jsonl."""
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "loss" in m]
    losses = np.array([[m["loss"], m["aux_loss"], m["z_loss"], m["grad_norm"]]
                       for m in steps]).view(Losses)
    losses.routing = [m["routing_digest"] for m in steps]
    return losses


LAYOUTS = {  # name: (ranks, overrides)
    "dp2": (2, []),
    "dp4": (4, []),
    "ep2": (2, ["--set", "parallel.expert_parallel_size=2"]),
    "ep4": (4, ["--set", "parallel.expert_parallel_size=4"]),
    "dp2xep2": (4, ["--set", "parallel.expert_parallel_size=2"]),
    "dp2-zero1": (2, ["--set", "parallel.zero_stage=1"]),
    "dp4-zero1": (4, ["--set", "parallel.zero_stage=1"]),
    "dp2xep2-zero1": (4, ["--set", "parallel.expert_parallel_size=2",
                          "--set", "parallel.zero_stage=1"]),
    "tp2": (2, ["--set", "parallel.tensor_parallel_size=2"]),
    "tp2xep2": (2, ["--set", "parallel.tensor_parallel_size=2",
                    "--set", "parallel.expert_parallel_size=2"]),
    "dp2xtp2xep2": (4, ["--set", "parallel.tensor_parallel_size=2",
                        "--set", "parallel.expert_parallel_size=2"]),
    "dp2xtp2-zero1": (4, ["--set", "parallel.tensor_parallel_size=2",
                          "--set", "parallel.zero_stage=1"]),
    "dp2-zero2": (2, ["--set", "parallel.zero_stage=2"]),
    "dp4-zero2": (4, ["--set", "parallel.zero_stage=2"]),
    "dp2-zero3": (2, ["--set", "parallel.zero_stage=3"]),
    "dp4-zero3": (4, ["--set", "parallel.zero_stage=3"]),
    "dp2xtp2-zero3": (4, ["--set", "parallel.tensor_parallel_size=2",
                          "--set", "parallel.zero_stage=3"]),
    "dp2xep2-zero3": (4, ["--set", "parallel.expert_parallel_size=2",
                          "--set", "parallel.zero_stage=3"]),
}
ROUTING = {  # name: overrides
    "dropless": [],
    "capacity": ["--set", "moe.capacity_factor=1.25"],
    "gshard": ["--set", "moe.gating=GSHARD_TOP2", "--set", "moe.capacity_factor=1.0"],
}


# GShard's sampled second expert under each kind of parallelism and ZeRO stage: data,
# expert (alone, with data, with tensor), tensor, all three, and ZeRO 1, 2 and 3.
GSHARD_LAYOUTS = ("dp2", "ep4", "dp2xep2", "tp2", "tp2xep2", "dp2xtp2xep2", "dp2-zero1",
                  "dp2-zero2", "dp2xep2-zero3")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    runs = {}

    def run_single(routing):
        if routing not in runs:
            runs[routing] = train(tmp_path_factory.mktemp(routing), "single", 1, ROUTING[routing])
        return runs[routing]

    return run_single


@pytest.mark.parametrize("layout, routing", [
    (layout, routing) for routing in ROUTING for layout in LAYOUTS
    if routing != "gshard" or layout in GSHARD_LAYOUTS])
def test_layout_matches_single_process(tmp_path, single, layout, routing):
    single_losses, single_weights = single(routing)
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + ROUTING[routing])
    assert losses.shape == (STEPS, 4)
    assert_run_matches(losses, weights, single_losses, single_weights, overrides)


@pytest.mark.parametrize("layout", ["dp2", "dp2-zero3"])
def test_bf16_layouts_match_single_process(tmp_path, layout):
    """bf16 compute: each replica's micro-batches see the same bf16 working copies and
    activations as in one process (ZeRO-3 rounds the gathered masters as allocation
    does), so step 1 agrees to rounding. Both runs use one thread per process, as the
    ranks do on two cores: with two threads the CPU kernels split some f32 sums
    differently, which can tip a bf16 rounding already in step 1 (measured with
    OpenBLAS's AVX2 kernels: gradient norms 1.2e-5 apart with two threads against one,
    1e-11 with one thread each). After step 1, a master that moved by one f32 ulp can
    round to the neighbouring bf16 value (0.4% away), so later steps spread more than in
    fp32, by how much depending on the CPU's kernels (measured on two machines:
    cross-entropy up to 6.7e-5, the other terms 1.9e-3, weights 0.006 lr on average per
    tensor and 1.3 lr at most). A wrong gradient moves whole tensors by about lr a step."""
    bf16 = ["--set", "runtime.precision=bf16", "--set", "runtime.threads=1"]
    single_losses, single_weights = train(tmp_path, "single", 1, bf16)
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + bf16)
    np.testing.assert_allclose(losses[0], single_losses[0], rtol=1e-6)
    np.testing.assert_allclose(losses[:, 0], single_losses[:, 0], rtol=2e-4)
    np.testing.assert_allclose(losses[:, 1:], single_losses[:, 1:], rtol=5e-3)
    lr = 3e-3
    for name, value in single_weights.items():
        diff = np.abs(weights[name] - value)
        assert diff.mean() < 0.02 * lr, (name, diff.mean())
        assert diff.max() < 2 * lr, (name, diff.max())


def test_bf16_tensor_parallel_tracks_single_process(tmp_path):
    """bf16 under tensor parallelism: each rank's partial products are rounded to bf16
    before the f32 sum, so unlike data parallelism step 1 already differs (measured: loss
    5e-5, gradient norm 1.3e-3; later cross-entropy 2.5e-4, aux/z/norm 1%, weights 0.19 lr
    on average per tensor, 4.3 lr at most), about as far as fp32 is from bf16 (aux/z/norm
    0.3%, weights 0.11 lr on average). A wrong gradient would move whole tensors by about
    lr a step."""
    bf16 = ["--set", "runtime.precision=bf16"]
    single_losses, single_weights = train(tmp_path, "single", 1, bf16)
    ranks, overrides = LAYOUTS["tp2"]
    losses, weights = train(tmp_path, "tp2", ranks, overrides + bf16)
    np.testing.assert_allclose(losses[0, :3], single_losses[0, :3], rtol=5e-4)
    np.testing.assert_allclose(losses[:, 0], single_losses[:, 0], rtol=1e-3)
    np.testing.assert_allclose(losses[:, 1:], single_losses[:, 1:], rtol=3e-2)
    lr = 3e-3
    for name, value in single_weights.items():
        diff = np.abs(weights[name] - value)
        assert diff.mean() < 0.5 * lr, (name, diff.mean())
        assert diff.max() < 8 * lr, (name, diff.max())


def test_tensor_parallel_chunked_logits_match(tmp_path):
    """Vocabulary-parallel scoring in row chunks: with runtime.max_logits_mb=1 a rank's
    512-token shard of the LM head scores 512 rows at a time, so a 16 x 64 micro-batch
    takes 2 chunks and backward recomputes their logits. One process scores whole
    micro-batches (4 MiB of logits, under the default budget)."""
    batch = ["--set", "train.global_batch_size=16", "--set", "train.micro_batch_size=16"]
    single_losses, single_weights = train(tmp_path, "single", 1, batch)
    ranks, overrides = LAYOUTS["tp2"]
    chunked = ["--set", "runtime.max_logits_mb=1"]
    losses, weights = train(tmp_path, "tp2", ranks, overrides + batch + chunked)
    assert_run_matches(losses, weights, single_losses, single_weights)


QWEN_STYLE = ["--set", "moe.num_shared_experts=1", "--set", "moe.shared_expert_ffn_hidden_size=128",
              "--set", "moe.shared_expert_gate=true", "--set", "model.attention_bias=true",
              "--set", "model.moe_layer_interval=2", "--set", "model.ffn_hidden_size=256",
              "--set", "model.tie_embeddings=true"]


@pytest.mark.parametrize("layout", ["dp2xtp2xep2-zero3", "tp2xep2"])
def test_shared_experts_dense_layers_and_tied_embeddings_match(tmp_path, layout):
    """A gated shared expert (split Megatron-style over tp), dense FFN layers, attention
    biases and a tied embedding (used by the first and the last ZeRO unit) under tensor,
    expert and ZeRO-3 parallelism against one process."""
    single_losses, single_weights = train(tmp_path, "single", 1, QWEN_STYLE)
    ranks, overrides = {
        "dp2xtp2xep2-zero3": (4, ["--set", "parallel.tensor_parallel_size=2",
                                  "--set", "parallel.expert_parallel_size=2",
                                  "--set", "parallel.zero_stage=3"]),
        "tp2xep2": LAYOUTS["tp2xep2"],
    }[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + QWEN_STYLE)
    assert_run_matches(losses, weights, single_losses, single_weights)


FINE_TUNE = ["--set", "optimizer.router_lr_scale=0.25", "--set", "train.freeze=attention"]


@pytest.fixture(scope="module")
def single_fine_tune(tmp_path_factory):
    return train(tmp_path_factory.mktemp("fine_tune"), "single", 1, FINE_TUNE)


@pytest.mark.parametrize("layout", ["tp2xep2", "dp2-zero1", "dp2-zero2", "dp2-zero3"])
def test_router_lr_and_freeze_match_single_process(tmp_path, single_fine_tune, layout):
    """A quarter learning rate for the router and frozen attention under tensor and
    expert parallelism and each ZeRO stage against one process: a layout that ignored
    either would move whole routers by 0.75 lr a step, or attention by lr."""
    single_losses, single_weights = single_fine_tune
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + FINE_TUNE)
    assert_run_matches(losses, weights, single_losses, single_weights, overrides)


def routed_alike(losses, single_losses):
    """The steps before the first whose routing differs: all of them when none does."""
    for step, (mine, theirs) in enumerate(zip(losses.routing, single_losses.routing)):
        if mine != theirs:
            return step
    return len(losses.routing)


def sums_exact(overrides):
    """Whether runtime.batch_invariant (COMMON) makes every sum of a layout exact, so that
    it must give one process's bits: all but tensor parallelism, whose partial products
    meet in another order (docs/determinism.md)."""
    return not any(o.startswith("parallel.tensor_parallel_size=") and o != "parallel.tensor_parallel_size=1"
                   for o in overrides)


def assert_run_matches(losses, weights, single_losses, single_weights, overrides=None):
    """A run of another layout (its `overrides`) against one process: bit for bit when
    the mode's sums are exact for the layout (sums_exact); otherwise an fp32 run up to the
    first step whose routing differs. Such layouts add their sums in other orders, so a
    near-tie between two experts (or, with a capacity, two tokens) can settle otherwise,
    and from there the runs part chaotically: a flip is detected by its routing_digest,
    never fitted by a tolerance (docs/determinism.md). Step 1 starts from the same weights
    and, under runtime.batch_invariant (COMMON), computes each token's forward bit for
    bit as one process does, so it must route alike; its gradient norm, compared there,
    checks every gradient of the layout before any routing can part."""
    if overrides is not None and sums_exact(overrides):
        assert losses.routing == single_losses.routing
        assert losses.tobytes() == single_losses.tobytes(), (losses, single_losses)
        assert set(weights) == set(single_weights)
        differing = [name for name in weights
                     if weights[name].tobytes() != single_weights[name].tobytes()]
        assert not differing, differing
        return
    same = routed_alike(losses, single_losses)
    assert same >= 1, (losses.routing, single_losses.routing)
    np.testing.assert_allclose(losses[0], single_losses[0], rtol=1e-6)
    np.testing.assert_allclose(losses[:same, 0], single_losses[:same, 0], rtol=1e-5)
    # Later steps inherit AdamW's sensitivity (see assert_weights_match): the aux loss,
    # z-loss and gradient norm move by up to about 1e-4.
    np.testing.assert_allclose(losses[:same, 1:], single_losses[:same, 1:], rtol=2e-4)
    assert set(weights) == set(single_weights)
    if same == len(losses):
        assert_weights_match(weights, single_weights)


def assert_weights_match(weights, reference):
    """AdamW divides by sqrt(v): where a gradient element is near zero, the rounding of
    the gradient sums can move its update by a fraction of lr (3e-3), and a capacity
    decision flipped by rounding moves a few more (up to ~1.5% of a router's weights,
    with tensor and expert parallelism together). So: 97% of the elements agree to 1e-5,
    and none is off by as much as half a step. A wrong gradient
    moves whole rows by about lr each step."""
    for name, value in reference.items():
        diff = np.abs(weights[name] - value)
        assert diff.max() < 1.5e-3, (name, diff.max())
        assert np.mean(diff > 1e-5) < 3e-2, (name, np.mean(diff > 1e-5))


def test_sharding_saves_memory(tmp_path):
    """Per-rank bytes from the memory report (the engine's allocator), dense and expert
    apart. 8 layers, so that no single layer's parameters, which ZeRO-3 gathers whole
    while the layer runs, dominate the dense ones. Outside runtime.batch_invariant, whose
    exact gradient sums keep a whole ledger on every rank."""
    def memory(name, ranks, overrides):
        run_dir = tmp_path / name
        run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir,
             "--dataset-cache", tmp_path / "datasets", *COMMON, "--set", "model.num_layers=8",
             "--set", "train.steps=1", "--set", "runtime.batch_invariant=false", *overrides],
            ranks=ranks)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            if "memory_bytes" in line:
                return json.loads(line)["memory_bytes"]

    dp4 = memory("dp4", 4, [])
    ep4 = memory("ep4", 4, ["--set", "parallel.expert_parallel_size=4"])
    for kind in ("expert_parameters", "expert_gradients", "expert_optimizer_state"):
        assert ep4[kind] == dp4[kind] // 4, kind
    for kind in ("parameters", "gradients", "optimizer_state"):
        assert ep4[kind] == dp4[kind], kind
    zero1 = memory("zero1", 4, ["--set", "parallel.zero_stage=1"])
    assert zero1["optimizer_state"] < 0.4 * dp4["optimizer_state"]
    assert zero1["parameters"] == dp4["parameters"]
    zero2 = memory("zero2", 4, ["--set", "parallel.zero_stage=2"])
    assert zero2["optimizer_state"] < 0.3 * dp4["optimizer_state"]
    assert zero2["gradients"] < 0.6 * dp4["gradients"]
    zero3 = memory("zero3", 4, ["--set", "parallel.zero_stage=3"])
    dense = lambda m: m["parameters"] + m["optimizer_state"]
    assert dense(zero3) <= dense(dp4) / 3, (dense(zero3), dense(dp4))
    assert zero3["gradients"] < 0.6 * dp4["gradients"]


def test_a_failing_rank_ends_the_job(tmp_path):
    # Rank 0 cannot create its run directory; rank 1 would wait for it in a collective.
    blocker = tmp_path / "file"
    blocker.write_text("")
    start = time.monotonic()
    result = run([SWITCHYARD, "train", RECIPE, "--run-dir", blocker / "run",
                  "--dataset-cache", tmp_path / "datasets", *COMMON],
                 ranks=2, expect=None, timeout=120)
    assert result.returncode != 0
    assert "switchyard: error (rank 0):" in result.stderr
    assert "cannot create the directory" in result.stderr
    assert time.monotonic() - start < 60


def test_an_impossible_layout_is_refused_before_any_work(tmp_path):
    result = run([SWITCHYARD, "train", RECIPE, "--run-dir", tmp_path / "run", *COMMON,
                  "--set", "parallel.expert_parallel_size=3"], ranks=2, expect=None, timeout=120)
    assert result.returncode != 0
    assert "parallel.expert_parallel_size" in result.stderr
    assert not (tmp_path / "run").exists()
