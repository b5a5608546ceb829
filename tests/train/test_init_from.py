"""Fine-tuning: a run started from weights (--init-from, train.init_from) evaluates them
exactly as `switchyard eval` does before its first step, under every parallel layout,
and the recipe `convert from-hf` writes trains from the imported weights once its data
is set; frozen parameters (train.freeze) stay bit-identical and get no optimizer state
(ZeRO 1, 2 and 3), and the router stays as loaded under optimizer.router_lr_scale 0;
a recipe that describes another model is refused naming the field and both values; a
run directory with a checkpoint resumes instead.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json

import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

SMALL = ["--set", "model.num_layers=2", "--set", "train.seq_len=32",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1"]
EVAL_WINDOWS = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Weights after 6 steps, and the dataset they were trained on."""
    root = tmp_path_factory.mktemp("trained")
    run([SWITCHYARD, "train", RECIPE, "--run-dir", root / "run", "--dataset-cache", root / "cache",
         *SMALL, "--set", "train.steps=6", "--set", "train.global_batch_size=4",
         "--set", "train.micro_batch_size=4", "--set", "train.eval_interval=0"],
        threads=1, timeout=600)
    dataset = next(p for p in (root / "cache").iterdir() if (p / "index.json").exists())
    return root / "run" / "checkpoints" / "final", dataset


def fine_tune(weights, dataset, run_dir, *extra, ranks=1, steps=1, batch=2, expect=0):
    """The first evaluation reads the windows `eval --windows EVAL_WINDOWS` reads."""
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, *SMALL,
                "--init-from", weights, "--set", "data.corpus=",
                "--set", f"data.dataset={dataset}", "--set", f"train.steps={steps}",
                "--set", f"train.global_batch_size={batch}", "--set", "train.micro_batch_size=1",
                "--set", "train.eval_interval=1", "--set", f"train.eval_tokens={EVAL_WINDOWS * 32}",
                "--set", "checkpoint.interval_steps=1", *extra],
               ranks=ranks, expect=expect, threads=1, timeout=600)


def first_val_loss(run_dir):
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("step") == 0 and "val_loss" in m:
            return m["val_loss"]
    raise AssertionError("no evaluation at step 0")


def eval_loss(weights, dataset):
    result = run([SWITCHYARD, "eval", weights, "--data", dataset, "--windows", EVAL_WINDOWS],
                 threads=1, timeout=600)
    return json.loads(result.stdout)["val_loss"]


def test_first_evaluation_equals_eval_of_the_weights(trained, tmp_path):
    weights, dataset = trained
    result = fine_tune(weights, dataset, tmp_path / "run")
    assert f"starting from the weights in {weights}" in result.stdout
    assert first_val_loss(tmp_path / "run") == eval_loss(weights, dataset)
    saved = (tmp_path / "run" / "checkpoints" / "final" / "recipe.textproto").read_text()
    assert f'init_from: "{weights}"' in saved


@pytest.mark.parametrize("layout", [
    ["--set", "parallel.tensor_parallel_size=2"],
    ["--set", "parallel.expert_parallel_size=2"],
    ["--set", "parallel.zero_stage=3"],
], ids=["tp2", "ep2", "dp2-zero3"])
def test_every_layout_loads_the_same_weights(trained, tmp_path, layout):
    weights, dataset = trained
    fine_tune(weights, dataset, tmp_path / "run", *layout, ranks=2)
    assert first_val_loss(tmp_path / "run") == pytest.approx(eval_loss(weights, dataset),
                                                             rel=1e-6)


def test_an_imported_model_trains_from_its_weights(trained, tmp_path):
    weights, dataset = trained
    hf, imported = tmp_path / "hf", tmp_path / "imported"
    for argv in (["to-hf", weights, hf], ["from-hf", hf, imported]):
        run([SWITCHYARD, "convert", *argv], threads=1, timeout=600)
    recipe = imported / "recipe.textproto"
    refused = run([SWITCHYARD, "train", recipe, "--run-dir", tmp_path / "run"], expect=1,
                  threads=1, timeout=600)
    assert "data.dataset is the placeholder" in refused.stderr
    result = run([SWITCHYARD, "train", recipe, "--run-dir", tmp_path / "run",
                  "--set", f"data.dataset={dataset}", "--set", "train.steps=1",
                  "--set", "train.seq_len=32", "--set", "train.eval_interval=1",
                  "--set", f"train.eval_tokens={EVAL_WINDOWS * 32}"], threads=1, timeout=600)
    assert f"starting from the weights in {imported} " in result.stdout
    assert first_val_loss(tmp_path / "run") == pytest.approx(eval_loss(weights, dataset),
                                                             rel=1e-6)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_frozen_parameters_stay_bit_identical_and_get_no_optimizer_state(trained, tmp_path,
                                                                         zero_stage):
    from safetensors.numpy import load_file
    weights, dataset = trained
    run_dir = tmp_path / "run"
    result = fine_tune(weights, dataset, run_dir, "--set", "train.freeze=router,attention",
                       "--set", f"parallel.zero_stage={zero_stage}", steps=2, ranks=2)
    assert "frozen by train.freeze" in result.stdout
    before = load_file(str(weights / "model.safetensors"))
    after = load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))
    frozen = [n for n in before if ".mlp.gate.weight" in n or ".self_attn." in n]
    assert frozen and all((before[n] == after[n]).all() for n in frozen)
    assert not (before["model.norm.weight"] == after["model.norm.weight"]).all()
    listing = run([SWITCHYARD, "inspect", run_dir / "checkpoints" / "step_2"], expect=None,
                  threads=1, timeout=600).stdout
    assert "exp_avg/model.norm.weight" in listing
    assert not any(f"exp_avg/{n}" in listing for n in frozen)


def test_router_lr_scale_zero_leaves_the_router_as_loaded(trained, tmp_path):
    """The weights' recipe has no router_lr_scale: an optimizer field may differ."""
    from safetensors.numpy import load_file
    weights, dataset = trained
    run_dir = tmp_path / "run"
    fine_tune(weights, dataset, run_dir, "--set", "optimizer.router_lr_scale=0",
              "--set", "parallel.zero_stage=2", steps=2, ranks=2)
    before = load_file(str(weights / "model.safetensors"))
    after = load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))
    routers = [n for n in before if ".mlp.gate.weight" in n]
    assert routers and all((before[n] == after[n]).all() for n in routers)
    for moved in ("model.norm.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert not (before[moved] == after[moved]).all()


def test_a_freeze_entry_that_names_nothing_is_refused(trained, tmp_path):
    weights, dataset = trained
    result = fine_tune(weights, dataset, tmp_path / "run", "--set", "train.freeze=routers",
                       expect=1)
    assert 'train.freeze "routers" names no parameter' in result.stderr


def test_another_model_is_refused_naming_both_values(trained, tmp_path):
    weights, dataset = trained
    result = fine_tune(weights, dataset, tmp_path / "run", "--set", "model.num_kv_heads=4",
                       expect=1)
    assert result.stderr.strip().splitlines() == [
        "switchyard: error: model.num_kv_heads is 4 in the recipe but 2 in the weights of "
        f"{weights} (train.init_from): the recipe must describe the weights' model"]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_checkpoint_in_the_run_directory_resumes_instead(trained, tmp_path):
    weights, dataset = trained
    fine_tune(weights, dataset, tmp_path / "run")
    result = fine_tune(weights, dataset, tmp_path / "run", "--extend-schedule", steps=2)
    assert "resuming from" in result.stdout and "(step 1)" in result.stdout
    assert "starting from the weights" not in result.stdout
