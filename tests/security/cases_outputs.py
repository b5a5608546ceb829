"""Outputs that would destroy what the user owns, run-directory files that would be followed
out of the run directory, and requests that cannot do what they say (see hostile.py for the
harness). tests/cli/test_outputs_never_alias_inputs.py tries every writing command."""
import os
import shutil

import numpy as np

from cases_data import _index, _reindex
from cases_instruction import _blend, _prepare, _template_text
from hostile import Case, h5py_file
from sy_testing import TINY_RECIPE

FOREIGN = "a file the user owns\n"


def _tokenizer_over_its_input(world, tmp):
    corpus = tmp / "corpus.txt"
    corpus.write_text("to be or not to be\n" * 100)
    return ["data", "tokenizer", "--input", str(corpus), "--vocab-size", "300", "--out",
            str(corpus)]


def _prepare_into_its_tokenizer(world, tmp):
    dataset = world.dataset(tmp)
    corpus = tmp / "corpus.txt"
    corpus.write_text("to be or not to be\n" * 100)
    return ["data", "prepare", "--tokenizer", str(dataset / "tokenizer.model"), "--input",
            str(corpus), "--out", str(dataset)]


def _bench_json_into_run_dir(world, tmp):
    run_dir = world.run_dir(tmp)
    return ["bench", "balance", str(world.weights(tmp)), "--batches", "1", "--run-dir",
            str(run_dir), "--json", str(run_dir / "balance.json")]


def _bench_one_file_twice(world, tmp):
    return ["bench", "balance", str(world.weights(tmp)), "--batches", "1", "--json",
            str(tmp / "balance"), "--report", str(tmp / "balance")]


def _plan_over_foreign(*options):
    def make(world, tmp):
        foreign = tmp / "notes.json"
        foreign.write_text(FOREIGN)
        return ["plan", str(TINY_RECIPE), "--world", "2", "--device-memory", "80GiB", "--json",
                str(foreign), *options]
    return make


def _run_dir_holding_init_from(world, tmp):
    run_dir = world.run_dir(tmp)
    return world.train_args(TINY_RECIPE, run_dir, "--init-from",
                            str(run_dir / "checkpoints" / "final"))


def _init_and_resume(world, tmp):
    run_dir = world.run_dir(tmp)
    return world.train_args(TINY_RECIPE, tmp / "other", "--init-from",
                            str(world.weights(tmp)), "--resume-from",
                            str(run_dir / "checkpoints" / "step_1"))


def _planted_link(place, outside_is_dir=False):
    """Resume a run directory whose `place` is a link to a copy of it outside."""
    def make(world, tmp):
        run_dir = world.run_dir(tmp)
        outside = tmp / "elsewhere"
        shutil.move(run_dir / place, outside)
        os.symlink(outside, run_dir / place, target_is_directory=outside_is_dir)
        return world.train_args(TINY_RECIPE, run_dir)
    return make


def _fresh_run_over(name, make_file):
    """A fresh train in a run directory that holds only `name`, made by make_file(path, tmp)."""
    def make(world, tmp):
        run_dir = tmp / "run"
        run_dir.mkdir()
        make_file(run_dir / name, tmp)
        return world.train_args(TINY_RECIPE, run_dir)
    return make


def _foreign_file(path, tmp):
    path.write_text('{"note": "' + FOREIGN.strip() + '"}\n')


def _link_outside(path, tmp):
    (tmp / "elsewhere").write_text(FOREIGN)
    os.symlink(tmp / "elsewhere", path)


def _freeze_everything(world, tmp):
    return world.train_args(TINY_RECIPE, tmp / "run", "--set",
                            "train.freeze=router,embeddings,attention,experts,norms,lm_head")


def _eval_without_loss_tokens(world, tmp):
    """eval on a dataset whose train shards carry no loss anywhere (a /loss_mask of zeros)."""
    dataset = world.dataset(tmp)
    for entry in _index(dataset)["splits"]["train"]:
        shard = dataset / entry["file"]
        with h5py_file(shard, "a") as f:
            f.create_dataset("loss_mask", data=np.zeros(f["tokens"].shape[0], dtype=np.uint8))
        _reindex(dataset, shard)
    return ["eval", str(world.weights(tmp)), "--data", str(dataset), "--split", "train",
            "--windows", "2"]


CASES = [
    Case("output-is-input", "output path", "data tokenizer --out the --input corpus",
         _tokenizer_over_its_input, "is the input"),
    Case("output-contains-input", "output path",
         "data prepare --out the dataset directory holding its --tokenizer",
         _prepare_into_its_tokenizer, "contains the input"),
    Case("output-inside-input", "output path", "bench balance --json inside its --run-dir",
         _bench_json_into_run_dir, "lies inside the input"),
    Case("output-twice", "output path", "bench balance --json and --report one file",
         _bench_one_file_twice, "is also --json"),
    Case("output-over-foreign-file", "output path", "plan --json over a file of the user's",
         _plan_over_foreign(), "exists: --overwrite replaces it if it is a plan JSON file"),
    Case("output-overwrite-foreign-file", "output path",
         "plan --json --overwrite over a file of the user's", _plan_over_foreign("--overwrite"),
         "exists and is not a plan JSON file"),
    Case("output-run-dir-holds-init-from", "output path",
         "train --run-dir R --init-from R/checkpoints/final (its final weights replaced)",
         _run_dir_holding_init_from, "contains the input"),
    Case("run-dir-metrics-symlink", "run directory",
         "metrics.jsonl a symbolic link out of the run directory, then resume",
         _planted_link("metrics.jsonl"), "metrics.jsonl: is a symbolic link"),
    Case("run-dir-latest-symlink", "run directory",
         "checkpoints/latest a symbolic link out of the run directory, then resume",
         _planted_link("checkpoints/latest"), "latest: is a symbolic link"),
    Case("run-dir-checkpoints-symlink", "run directory",
         "checkpoints a symbolic link out of the run directory, then resume",
         _planted_link("checkpoints", outside_is_dir=True), "checkpoints: is a symbolic link"),
    Case("run-dir-metrics-foreign", "run directory",
         "a fresh train where metrics.jsonl is a JSON Lines file of the user's",
         _fresh_run_over("metrics.jsonl", _foreign_file),
         "metrics.jsonl: was not written by switchyard (line 1 is not one of its records)"),
    Case("run-dir-metrics-partial-symlink", "run directory",
         "a fresh train where metrics.jsonl.partial is a symbolic link out of the run "
         "directory", _fresh_run_over("metrics.jsonl.partial", _link_outside),
         "metrics.jsonl.partial: is a symbolic link"),
    Case("init-from-with-resume-from", "train options", "--init-from and --resume-from together",
         _init_and_resume, "--resume-from excludes --init-from"),
    Case("freeze-everything", "recipe train.freeze", "every group frozen: nothing to train",
         _freeze_everything, "freezes every parameter"),
    Case("blend-weights-sum-infinite", "recipe data.sources", "two weights of 1e308 (sum inf)",
         _blend(lambda d, t: f'sources {{ name: "a" dataset: "{d}" weight: 1e308 }} '
                             f'sources {{ name: "b" dataset: "{d}" weight: 1e308 }}'),
         "data.sources weights sum to inf"),
    Case("chat-answers-all-empty", "instruction JSON Lines",
         "every answer empty, with a template that ends an answer with nothing: no token "
         "carries loss",
         _prepare('{"prompt": "Who is there?", "response": ""}\n' * 4, _template_text(
             '{"format": "switchyard-chat-template", "name": "bare", "roles": '
             '{"user": {"prefix": "Q: "}, "assistant": {"prefix": "", "loss": true}}}')),
         "no token of the conversations carries loss"),
    Case("eval-no-loss-tokens", "dataset shard", "eval of a split whose /loss_mask is all 0",
         _eval_without_loss_tokens,
         "dataset: the 2 evaluation windows of its train split hold no token that carries loss"),
]
