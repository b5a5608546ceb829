"""Pipeline layouts in `switchyard train`: each pipeline rank trains its chunks of the
model under GPipe, 1F1B and interleaved 1F1B, and the losses, routing statistics and
final weights equal one process's bit for bit under runtime.batch_invariant (with
data-parallel replicas in each stage, to the data-parallel layouts' tolerances), as do its evaluations through the stages; a pipeline run's checkpoints resume under one process
and the other way round, and its final weights convert to Hugging Face format. Loss-free
balancing moves each stage's biases and train.freeze freezes what each stage holds, as
one process does.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
import pathlib
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

import test_train_equivalence as layouts
from sy_testing import SWITCHYARD, rewind, run
from test_train_equivalence import COMMON, RECIPE

# tiny's aux loss per layer; ALL_LAYER below takes transformers' formula instead. Batch-
# invariant products (docs/determinism.md): a stage rank computes with fewer threads than
# one process, and OpenBLAS's order of addition follows the thread count and the CPU.
PIPELINE_COMMON = [*COMMON, "--set", "moe.aux_loss_per_layer=true",
                   "--set", "runtime.batch_invariant=true"]
# Transformers' aux loss over all layers together (the transformers-parity recipes'): each
# activation carries the routing sums through its chunk and each gradient the whole
# model's, so every router's gradient is one process's.
ALL_LAYER = ["--set", "moe.aux_loss_per_layer=false"]


def uneven_recipe(tmp_path, layers):
    """tiny.textproto with parallel.pipeline_layers (a list, which --set does not take)."""
    corpus = pathlib.Path(RECIPE).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare.txt"
    text = pathlib.Path(RECIPE).read_text().replace(
        '"../data/corpus/tinyshakespeare.txt"', json.dumps(str(corpus)))
    path = tmp_path / "uneven.textproto"
    path.write_text(text + "parallel { pipeline_layers: [%s] }\n" % ", ".join(map(str, layers)))
    return str(path)


def train(tmp_path, name, ranks, extra=(), recipe=RECIPE):
    run_dir = tmp_path / name
    result = run([SWITCHYARD, "train", recipe, "--run-dir", run_dir,
                  "--dataset-cache", tmp_path.parent / "datasets", *PIPELINE_COMMON, *extra],
                 ranks=ranks)
    return run_dir, result.stdout


def logged_steps(run_dir):
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "loss" in m]


def final_weights(run_dir):
    return load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))


def assert_run_matches(run_dir, single_dir):
    """Losses, routing statistics and final weights one process's bit for bit: the last
    stage reports every loss, its router terms summed over every layer in one process's
    order from the sums the stages pass on."""
    steps, single = logged_steps(run_dir), logged_steps(single_dir)
    assert [m["step"] for m in steps] == [m["step"] for m in single]
    for mine, theirs in zip(steps, single):
        for key in ("loss", "cross_entropy", "aux_loss", "z_loss"):
            assert mine[key] == theirs[key], key
        # Each stage sums its gradients' squares, then the stages' sums add up: another
        # order than one process's sum over every parameter (an ulp or so).
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-12, abs=0)
        # Every stage's MoE layers, in the model's layer order.
        assert mine["layer_imbalance"] == theirs["layer_imbalance"]
        assert mine["worst_load_ratio"] == theirs["worst_load_ratio"]
        assert mine["dropped_fraction"] == theirs["dropped_fraction"]
    weights, reference = final_weights(run_dir), final_weights(single_dir)
    assert weights.keys() == reference.keys()
    for name, value in reference.items():
        assert np.array_equal(weights[name], value), name


def assert_layout_matches(run_dir, single_dir):
    """A run with data-parallel replicas or tensor-parallel shards in its stages against
    one process, to the layouts' tolerances (test_train_equivalence.assert_run_matches)."""
    layouts.assert_run_matches(layouts.logged_losses(run_dir), final_weights(run_dir),
                               layouts.logged_losses(single_dir), final_weights(single_dir))


@pytest.fixture(scope="module")
def single_two_layers(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single2"), "run", 1)[0]


@pytest.fixture(scope="module")
def single_nine_layers(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single9"), "run", 1, ["--set", "model.num_layers=9"])[0]


# One layer per stage: losses, routing statistics and weights are one process's bit for
# bit.
@pytest.mark.parametrize("schedule", ["GPIPE", "ONE_F_ONE_B"])
def test_two_stages_match_one_process_bit_for_bit(tmp_path, single_two_layers, schedule):
    run_dir, out = train(tmp_path, "run", 2, ["--set", "parallel.pipeline_parallel_size=2",
                                              "--set", f"parallel.pipeline_schedule={schedule}"])
    assert_run_matches(run_dir, single_two_layers)
    # The memory line names the stage it measured (the stages hold different layers).
    assert "\nmemory of pipeline stage 0 of 2 (rank 0; each stage holds its own layers): " in out


def test_gshard_with_a_capacity_matches_one_process_bit_for_bit(tmp_path):
    # A layer's GShard draws start where the model's earlier MoE layers leave the
    # micro-batch's stream, so a later stage makes one process's draws without the
    # earlier stage's: losses, routing statistics and weights bit for bit.
    gshard = ["--set", "moe.gating=GSHARD_TOP2", "--set", "moe.capacity_factor=1.0"]
    single, _ = train(tmp_path, "single", 1, gshard)
    staged, _ = train(tmp_path, "staged", 2, [*gshard, "--set", "parallel.pipeline_parallel_size=2"])
    assert logged_steps(single)[-1]["dropped_fraction"] > 0
    assert_run_matches(staged, single)


def test_recomputing_each_stages_first_layer_matches_one_process(tmp_path):
    # train.recompute_layers counts each stage's layers (layers 0 and 2 of 4 here); the
    # recomputation replays the forward bit for bit.
    four = ["--set", "model.num_layers=4"]
    single, _ = train(tmp_path, "single", 1, four)
    staged, _ = train(tmp_path, "staged", 2, [*four, "--set", "parallel.pipeline_parallel_size=2",
                                              "--set", "train.recompute=FULL",
                                              "--set", "train.recompute_layers=1"])
    assert_run_matches(staged, single)


def test_interleaved_uneven_stages_match_one_process(tmp_path, single_nine_layers):
    # 4 stages x 2 chunks over 9 layers, the first chunk 2 of them.
    recipe = uneven_recipe(tmp_path, [2, 1, 1, 1, 1, 1, 1, 1])
    run_dir, _ = train(tmp_path, "run", 4, ["--set", "model.num_layers=9",
                                            "--set", "parallel.pipeline_parallel_size=4",
                                            "--set", "parallel.virtual_pipeline_size=2"],
                       recipe=recipe)
    assert_run_matches(run_dir, single_nine_layers)


@pytest.fixture(scope="module")
def single_all_layer(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single_all"), "run", 1, ALL_LAYER)[0]


def assert_aux_losses_equal(run_dir, single_dir):
    mine, theirs = logged_steps(run_dir), logged_steps(single_dir)
    assert mine[0]["aux_loss"] > 0
    assert [m["aux_loss"] for m in mine] == [m["aux_loss"] for m in theirs]


# The aux loss is the last stage's, from sums added in one process's order, and every
# router's gradient reads the whole model's sums: losses and weights bit for bit.
@pytest.mark.parametrize("schedule", ["GPIPE", "ONE_F_ONE_B"])
def test_all_layer_aux_loss_on_two_stages_matches_one_process(tmp_path, single_all_layer,
                                                              schedule):
    run_dir, _ = train(tmp_path, "run", 2, [*ALL_LAYER,
                                            "--set", "parallel.pipeline_parallel_size=2",
                                            "--set", f"parallel.pipeline_schedule={schedule}"])
    assert_run_matches(run_dir, single_all_layer)
    assert_aux_losses_equal(run_dir, single_all_layer)


def test_all_layer_aux_loss_on_interleaved_uneven_stages_matches_one_process(tmp_path):
    nine = ["--set", "model.num_layers=9", *ALL_LAYER]
    single, _ = train(tmp_path, "single", 1, nine)
    recipe = uneven_recipe(tmp_path, [2, 1, 1, 1, 1, 1, 1, 1])
    run_dir, _ = train(tmp_path, "run", 4, [*nine, "--set", "parallel.pipeline_parallel_size=4",
                                            "--set", "parallel.virtual_pipeline_size=2"],
                       recipe=recipe)
    assert_run_matches(run_dir, single)
    assert_aux_losses_equal(run_dir, single)


@pytest.mark.parametrize("overrides", [
    [],
    ["--set", "parallel.expert_parallel_size=2", "--set", "parallel.zero_stage=1"],
], ids=["pp2xdp2", "pp2xdp2xep2-zero1"])
def test_all_layer_aux_loss_with_replicas_matches_one_process(tmp_path, single_all_layer,
                                                               overrides):
    # Mixtral's shape of recipe: each replica carries its own micro-batches' sums; the
    # replicas' gradients add up to the data-parallel layouts' tolerances.
    run_dir, _ = train(tmp_path, "run", 4, [*ALL_LAYER,
                                            "--set", "parallel.pipeline_parallel_size=2",
                                            *overrides])
    assert_layout_matches(run_dir, single_all_layer)


@pytest.mark.parametrize("overrides", [
    [],
    ["--set", "parallel.expert_parallel_size=2", "--set", "parallel.zero_stage=1"],
    ["--set", "parallel.zero_stage=2"],
    ["--set", "parallel.expert_parallel_size=2", "--set", "parallel.zero_stage=3"],
    ["--set", "parallel.tensor_parallel_size=2"],
    ["--set", "parallel.tensor_parallel_size=2", "--set", "parallel.expert_parallel_size=2",
     "--set", "parallel.zero_stage=1"],
], ids=["pp2xdp2", "pp2xdp2xep2-zero1", "pp2xdp2-zero2", "pp2xdp2xep2-zero3", "pp2xtp2",
        "pp2xtp2xep2-zero1"])
def test_stages_with_data_parallel_replicas_match_one_process(tmp_path, single_two_layers,
                                                               overrides):
    # The replicas' gradients (or the tensor-parallel shards' partial sums) add up in
    # another order than one process's: the layouts' tolerances
    # (test_train_equivalence.assert_run_matches).
    run_dir, _ = train(tmp_path, "run", 4, ["--set", "parallel.pipeline_parallel_size=2",
                                            *overrides])
    assert_layout_matches(run_dir, single_two_layers)


# The sigmoid router's loss-free balancing: each stage moves the biases of its own MoE layers
# from their loads over every micro-batch and data-parallel replica of the step.
SIGMOID = ["--set", "moe.score_function=SIGMOID", "--set", "moe.aux_loss_coef=0",
           "--set", "moe.bias_update_rate=0.01", "--set", "moe.renormalize=true",
           "--set", "moe.num_groups=4", "--set", "moe.top_groups=2"]


def biases(weights, layers=2):
    found = {name: value for name, value in weights.items()
             if name.endswith(".mlp.gate.e_score_correction_bias")}
    assert len(found) == layers, sorted(weights)
    return found


@pytest.fixture(scope="module")
def single_sigmoid(tmp_path_factory):
    return train(tmp_path_factory.mktemp("sigmoid"), "run", 1, SIGMOID)[0]


def test_bias_balancing_on_two_stages_matches_one_process_bit_for_bit(tmp_path, single_sigmoid):
    # The losses and the weights, biases included, are one process's bit for bit.
    run_dir, _ = train(tmp_path, "run", 2, [*SIGMOID, "--set", "parallel.pipeline_parallel_size=2"])
    assert_run_matches(run_dir, single_sigmoid)
    assert all(np.any(bias != 0) for bias in biases(final_weights(run_dir)).values())


def test_bias_balancing_with_a_stage_of_dense_layers_matches_one_process(tmp_path):
    # The first of four stages holds the one dense layer and no bias to move.
    dense = ["--set", "model.num_layers=4", "--set", "model.first_dense_layers=1",
             "--set", "model.ffn_hidden_size=64"]
    single, _ = train(tmp_path, "single", 1, [*SIGMOID, *dense])
    staged, _ = train(tmp_path, "staged", 4, [*SIGMOID, *dense,
                                              "--set", "parallel.pipeline_parallel_size=4"])
    assert_run_matches(staged, single)
    assert all(np.any(bias != 0) for bias in biases(final_weights(staged), layers=3).values())


def test_bias_balancing_on_two_stages_of_two_replicas_matches_one_process(tmp_path,
                                                                          single_sigmoid):
    # The loads are counts, summed exactly in any order: the biases are one process's bit
    # for bit, the rest to the data-parallel layouts' tolerances.
    run_dir, _ = train(tmp_path, "run", 4, [*SIGMOID, "--set", "parallel.pipeline_parallel_size=2"])
    weights, reference = final_weights(run_dir), final_weights(single_sigmoid)
    for name, bias in biases(weights).items():
        assert np.any(bias != 0), name
        np.testing.assert_array_equal(bias, reference[name], err_msg=name)
    assert_layout_matches(run_dir, single_sigmoid)


def frozen_line(out):
    return [line for line in out.splitlines() if line.startswith("frozen by train.freeze")]


# Each rank freezes what it holds: attention on every stage, the embeddings on the first
# stage only and the head on the last only (names no other stage holds).
@pytest.mark.parametrize("freeze", ["router,attention", "embeddings,lm_head"])
def test_freeze_on_two_stages_matches_one_process_bit_for_bit(tmp_path, freeze):
    frozen = ["--set", f"train.freeze={freeze}"]
    single, single_out = train(tmp_path, "single", 1, frozen)
    staged, out = train(tmp_path, "staged", 2, [*frozen, "--set", "parallel.pipeline_parallel_size=2"])
    assert frozen_line(out) == frozen_line(single_out) and frozen_line(out), out
    assert_run_matches(staged, single)


@pytest.mark.parametrize("zero", [1, 2])
def test_freeze_on_two_stages_of_two_replicas_matches_one_process(tmp_path, zero):
    frozen = ["--set", "train.freeze=attention,embeddings", "--set", f"parallel.zero_stage={zero}"]
    single, _ = train(tmp_path, "single", 1, frozen)
    staged, _ = train(tmp_path, "staged", 4, [*frozen, "--set", "parallel.pipeline_parallel_size=2"])
    weights, reference = final_weights(staged), final_weights(single)
    assert_layout_matches(staged, single)
    for name in reference:
        if ".self_attn." in name or "embed_tokens" in name:
            np.testing.assert_array_equal(weights[name], reference[name], err_msg=name)


@pytest.mark.parametrize("saved_by,resumed_by", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_across_pipeline_layouts(tmp_path, single_two_layers, saved_by,
                                                      resumed_by):
    def pipeline(ranks):
        return ["--set", f"parallel.pipeline_parallel_size={ranks}",
                "--set", "checkpoint.interval_steps=2"]
    run_dir, _ = train(tmp_path, "run", saved_by, pipeline(saved_by))
    rewind(run_dir, 2)
    _, out = train(tmp_path, "run", resumed_by, pipeline(resumed_by))
    assert "(step 2)" in out and "resuming from" in out
    assert_run_matches(run_dir, single_two_layers)


@pytest.mark.parametrize("layout", [
    ["--set", "parallel.pipeline_parallel_size=4"],
    ["--set", "parallel.pipeline_parallel_size=2", "--set", "parallel.tensor_parallel_size=2",
     "--set", "parallel.zero_stage=1"],
    ["--set", "parallel.pipeline_parallel_size=2", "--set", "parallel.expert_parallel_size=2",
     "--set", "parallel.zero_stage=3"],
], ids=["pp4", "pp2xtp2-zero1", "pp2xdp2xep2-zero3"])
def test_a_one_process_checkpoint_resumes_under_four_ranks(tmp_path, layout):
    # A one-process run of 4 layers stopped after step 2 resumes under 4 ranks: 4 stages,
    # or 2 stages with tensor parallelism, or with replicas, expert parallelism and ZeRO-3.
    four = ["--set", "model.num_layers=4", "--set", "checkpoint.interval_steps=2"]
    single, _ = train(tmp_path, "single", 1, four)
    run_dir = tmp_path / "run"
    shutil.copytree(single, run_dir)
    rewind(run_dir, 2)
    # As if it had stopped there: no final weights, no metrics past step 2.
    shutil.rmtree(run_dir / "checkpoints" / "final")
    metrics = run_dir / "metrics.jsonl"
    kept = [l for l in metrics.read_text().splitlines() if json.loads(l).get("step", 0) <= 2]
    metrics.write_text("".join(l + "\n" for l in kept))
    _, out = train(tmp_path, "run", 4, [*four, *layout])
    assert "(step 2)" in out and "resuming from" in out
    if layout == ["--set", "parallel.pipeline_parallel_size=4"]:
        assert_run_matches(run_dir, single)
        return
    assert_layout_matches(run_dir, single)


def test_pipeline_final_weights_convert_to_hugging_face(tmp_path):
    run_dir, _ = train(tmp_path, "run", 2, ["--set", "parallel.pipeline_parallel_size=2"])
    run([SWITCHYARD, "convert", "to-hf", run_dir / "checkpoints" / "final", tmp_path / "hf"],
        timeout=120)
    assert (tmp_path / "hf" / "config.json").exists()


def test_evaluation_through_the_stages_matches_one_process(tmp_path):
    evaluating = ["--set", "train.eval_interval=2", "--set", "train.eval_tokens=1024"]
    single, _ = train(tmp_path, "single", 1, evaluating)
    staged, _ = train(tmp_path, "staged", 2, [*evaluating,
                                              "--set", "parallel.pipeline_parallel_size=2"])

    def val_losses(run_dir):
        lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(m["step"], m["val_loss"]) for m in lines if "val_loss" in m]
    assert [step for step, _ in val_losses(single)] == [0, 2, 4]
    assert val_losses(staged) == val_losses(single)


def test_a_pipeline_size_that_does_not_divide_the_world_is_refused(tmp_path):
    result = run([SWITCHYARD, "train", RECIPE, "--run-dir", tmp_path / "run", *COMMON,
                  "--set", "parallel.pipeline_parallel_size=3", "--set", "model.num_layers=3"],
                 ranks=2, expect=None, timeout=120)
    assert result.returncode != 0
    assert "parallel.pipeline_parallel_size (3) must divide the world size (2)" in result.stderr
