"""Nothing the user owns is destroyed by an output path (core/runtime/output_paths.h).

For every command that writes, each output is tried as one of its inputs, inside an input
directory, as a directory containing an input, and over an existing file of another kind
without and with --overwrite: each is refused with exit status 1 and one line on stderr
(naming the output and the input it aliases), and every file of the case, the inputs
among them, is byte-identical afterwards. An output of the command's own kind is replaced
with --overwrite. A run directory whose metrics.jsonl, checkpoints/latest or checkpoints
is a symbolic link out of it is refused on resume, naming the link, and the file outside
is untouched.

Run by ctest with the interop Python; SWITCHYARD names the binary. The inputs come from a
short tiny run (tests/security/hostile.py).
"""
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from cases_upcycle import _dense
from sy_testing import CORPUS, SWITCHYARD, TINY_RECIPE, run

FOREIGN = b"a file the user owns, of no kind a command writes\n"


def snapshot(root):
    """Every file under `root` (links as their targets) with its sha256."""
    files = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_symlink():
            files[str(path)] = "link to " + os.readlink(path)
        elif path.is_file():
            files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            files[str(path)] = "directory"
    return files


def status_and_errors(argv):
    """Runs switchyard with argv: its exit status and stderr lines."""
    result = run([SWITCHYARD, *argv], expect=None, threads=1)
    return result.returncode, result.stderr.splitlines()


class Command:
    """One writing command: make(world, tmp) gives the inputs it names on its command line,
    argv(out), its command line writing `out`, and a directory that contains an input
    where the command writes."""

    def __init__(self, name, make, overwrite=True):
        self.name = name
        self.make = make
        self.overwrite = overwrite


def _tokenizer(world, tmp):
    corpus = tmp / "in" / "corpus.txt"
    corpus.parent.mkdir()
    shutil.copy(CORPUS, corpus)
    return [corpus], lambda out: [
        "data", "tokenizer", "--input", str(corpus), "--vocab-size", "400", "--out",
        str(out)], tmp


def _prepare(world, tmp):
    dataset = world.dataset(tmp)
    corpus = tmp / "in" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text("to be or not to be\n" * 50)
    return [corpus, dataset / "tokenizer.model"], lambda out: [
        "data", "prepare", "--tokenizer", str(dataset / "tokenizer.model"), "--input",
        str(corpus), "--out", str(out)], dataset


def _train(world, tmp):
    dataset = world.dataset(tmp)
    run_dir = world.run_dir(tmp)
    weights = run_dir / "checkpoints" / "final"
    recipe = tmp / "recipe.textproto"
    shutil.copy(TINY_RECIPE, recipe)
    return [dataset, weights, recipe], lambda out: world.train_args(
        recipe, out, "--set", "data.corpus=", "--set", f"data.dataset={dataset}",
        "--init-from", str(weights)), run_dir


def _to_hf(world, tmp):
    weights = world.weights(tmp)
    return [weights], lambda out: ["convert", "to-hf", str(weights), str(out)], tmp


def _from_hf(world, tmp):
    hf = world.hf(tmp)
    return [hf], lambda out: ["convert", "from-hf", str(hf), str(out)], tmp


def _upcycle(world, tmp):
    hf = _dense(world, tmp)
    return [hf], lambda out: [
        "convert", "upcycle", str(hf), str(out), "--experts", "4", "--top-k", "2"], tmp


def _bench(option):
    def make(world, tmp):
        weights = world.weights(tmp)
        run_dir = world.run_dir(tmp)
        return [weights, run_dir], lambda out: [
            "bench", "balance", str(weights), "--batches", "1", "--run-dir", str(run_dir),
            option, str(out)], tmp
    return make


def _plan(world, tmp):
    recipe = tmp / "in" / "recipe.textproto"
    recipe.parent.mkdir()
    shutil.copy(TINY_RECIPE, recipe)
    return [recipe], lambda out: [
        "plan", str(recipe), "--world", "2", "--device-memory", "80GiB", "--json",
        str(out)], tmp


COMMANDS = [Command("tokenizer", _tokenizer), Command("prepare", _prepare, overwrite=False),
            Command("train", _train, overwrite=False), Command("to-hf", _to_hf),
            Command("from-hf", _from_hf), Command("upcycle", _upcycle),
            Command("bench-json", _bench("--json")), Command("bench-report", _bench("--report")),
            Command("plan", _plan)]


def refused(argv, tmp, *named):
    """Runs a command that must be refused in one line naming `named`, changing nothing
    under `tmp`."""
    before = snapshot(tmp)
    status, lines = status_and_errors(argv)
    assert status == 1, f"{argv}: exit status {status}, stderr {lines}"
    assert len(lines) == 1, lines
    for path in named:
        assert str(path) in lines[0], lines[0]
    assert snapshot(tmp) == before, f"{argv} changed files"
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_output_that_is_an_input(command, world, tmp_path):
    inputs, argv, _ = command.make(world, tmp_path)
    for path in inputs:
        line = refused(argv(path), tmp_path, path)
        assert "is the input" in line, line


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_output_inside_an_input_directory(command, world, tmp_path):
    inputs, argv, _ = command.make(world, tmp_path)
    for path in inputs:
        line = refused(argv(path / "out"), tmp_path, path / "out", path)
        assert "lies inside the input" in line, line


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_output_containing_an_input(command, world, tmp_path):
    inputs, argv, container = command.make(world, tmp_path)
    line = refused(argv(container), tmp_path, container)
    assert "contains the input" in line, line
    assert any(str(path) in line for path in inputs), line


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_existing_foreign_file(command, world, tmp_path):
    _, argv, _ = command.make(world, tmp_path)
    foreign = tmp_path / "mine.txt"
    foreign.write_bytes(FOREIGN)
    refused(argv(foreign), tmp_path, foreign)
    if command.overwrite:
        line = refused([*argv(foreign), "--overwrite"], tmp_path, foreign)
        assert "is not a" in line, line
    assert foreign.read_bytes() == FOREIGN


def test_merge_parts_over_a_foreign_file(tmp_path):
    foreign = tmp_path / "mine.txt"
    foreign.write_bytes(FOREIGN)
    refused(["data", "merge-parts", str(foreign)], tmp_path, foreign)


def test_two_outputs_that_are_one_file(world, tmp_path):
    inputs, _, _ = _bench("--json")(world, tmp_path)
    out = tmp_path / "balance"
    refused(["bench", "balance", str(inputs[0]), "--batches", "1", "--json", str(out),
             "--report", str(out)], tmp_path, out)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.name in ("tokenizer", "plan")],
                         ids=["tokenizer", "plan"])
def test_overwrite_replaces_its_own_kind(command, world, tmp_path):
    _, argv, _ = command.make(world, tmp_path)
    out = tmp_path / "out"
    assert status_and_errors(argv(out))[0] == 0
    refused(argv(out), tmp_path, out)
    status, lines = status_and_errors([*argv(out), "--overwrite"])
    assert status == 0, lines


def _resume(world, run_dir):
    return world.train_args(TINY_RECIPE, run_dir)


def test_metrics_symlink_out_of_the_run_directory(world, tmp_path):
    run_dir = world.run_dir(tmp_path)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_bytes(FOREIGN)
    (run_dir / "metrics.jsonl").unlink()
    os.symlink(outside, run_dir / "metrics.jsonl")
    line = refused(_resume(world, run_dir), tmp_path, run_dir / "metrics.jsonl")
    assert "symbolic link" in line, line


def test_latest_symlink_out_of_the_run_directory(world, tmp_path):
    run_dir = world.run_dir(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"step_2\n")
    (run_dir / "checkpoints" / "latest").unlink()
    os.symlink(outside, run_dir / "checkpoints" / "latest")
    line = refused(_resume(world, run_dir), tmp_path, run_dir / "checkpoints" / "latest")
    assert "symbolic link" in line, line


def test_checkpoints_symlink_out_of_the_run_directory(world, tmp_path):
    run_dir = world.run_dir(tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.move(run_dir / "checkpoints", outside)
    os.symlink(outside, run_dir / "checkpoints")
    line = refused(_resume(world, run_dir), tmp_path, run_dir / "checkpoints")
    assert "symbolic link" in line, line
