"""One writer at a time in an output directory (core/runtime/dir_lock.h): a second `train`
on a run directory that a running `train` writes is refused in one line naming the first's
host and pid, and the first ends with the records and weights of an undisturbed run; a
lock whose holder was killed (SIGKILL) is taken over; a second `data prepare` into one
output (or of one part) is refused naming the first, whose dataset is complete; and every
command that writes a directory is refused, creating and changing nothing there, while
another process holds the directory's lock. A file system that cannot lock (flock failing
with ENOLCK, from an LD_PRELOAD shim) is refused unless SWITCHYARD_ALLOW_UNLOCKED=1.

The first writer is stopped (SIGSTOP) once it holds the lock and has written, and continued
(SIGCONT) after the second has been refused: it is then certainly mid-run when the second
starts, however fast or loaded the machine.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_prepare_parts import files_of, prepare_args, split_stream  # noqa: E402

LOCK = ".switchyard.lock"
STEPS = 60
# Wall-clock figures of a metrics line; every other field is the same in any run of the
# same command with one thread.
TIMINGS = {"tokens_per_s", "mfu", "elapsed_s", "all_to_all_share"}


def train_args(run_dir, cache, *extra):
    """The tiny recipe shortened, one thread (deterministic), a checkpoint every 10 steps."""
    return [SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
            "--dataset-cache", str(cache), "--peak-gflops", "100",
            "--set", f"train.steps={STEPS}", "--set", "optimizer.warmup_steps=1",
            "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
            "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2",
            "--set", "model.num_layers=1", "--set", "train.seq_len=32",
            "--set", "checkpoint.interval_steps=10", "--set", "runtime.threads=1", *extra]


def start(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(child, ready):
    while not ready() and child.poll() is None:
        time.sleep(0.002)
    assert child.poll() is None, "the first writer ended before the second could start"


def holds_lock(directory, child, name=LOCK):
    """Whether `directory`'s lock file names `child` (it may be half-written: not yet)."""
    try:
        return json.loads((Path(directory) / name).read_text())["pid"] == child.pid
    except (OSError, ValueError, KeyError, TypeError):
        return False


def has_metrics_line(run_dir):
    path = run_dir / "metrics.jsonl"
    return path.exists() and '"loss"' in path.read_text()


def assert_refused_naming(result, pid, directory):
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"switchyard: error: {directory}: in use by another writer "), line
    assert f"host {socket.gethostname()}, pid {pid}, since " in line, line


def records(run_dir):
    """Every line of metrics.jsonl, its wall-clock figures left out."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


def final_weights(run_dir):
    return (run_dir / "checkpoints" / "final" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The run, alone in its directory, and the dataset cache it made."""
    root = tmp_path_factory.mktemp("undisturbed")
    run(train_args(root / "run", root / "cache"))
    return root / "run", root / "cache"


def test_a_second_train_is_refused_and_the_first_ends_undisturbed(undisturbed, tmp_path):
    reference, cache = undisturbed
    run_dir = tmp_path / "run"
    first = start(train_args(run_dir, cache))
    wait_until(first, lambda: has_metrics_line(run_dir))
    first.send_signal(signal.SIGSTOP)
    try:
        second = run(train_args(run_dir, cache), expect=1)
    finally:
        first.send_signal(signal.SIGCONT)
    assert_refused_naming(second, first.pid, run_dir)
    assert "--run-dir " + str(run_dir) in second.stderr  # the holder's command line
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr

    assert records(run_dir) == records(reference)
    assert len(records(run_dir)) == STEPS + 1  # the memory line and one per step
    assert final_weights(run_dir) == final_weights(reference)
    assert not (run_dir / LOCK).exists()  # released with the run


def test_the_lock_of_a_killed_train_is_taken_over(undisturbed, tmp_path):
    reference, cache = undisturbed
    run_dir = tmp_path / "run"
    first = start(train_args(run_dir, cache))
    wait_until(first, lambda: (run_dir / "checkpoints" / "latest").exists())
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert holds_lock(run_dir, first)  # the dead holder's identity stays, unlocked

    again = run(train_args(run_dir, cache))
    assert "resuming from" in again.stdout, again.stdout
    assert final_weights(run_dir) == final_weights(reference)
    assert not (run_dir / LOCK).exists()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, prepare_inputs):
    """A tokenizer, three input files, and the dataset one undisturbed prepare makes of
    them."""
    tokenizer, files = prepare_inputs
    whole = tmp_path_factory.mktemp("inputs") / "whole"
    run(prepare_args(tokenizer, files, whole))
    return tokenizer, files, whole


def test_a_second_prepare_into_one_output_is_refused_naming_the_first(inputs, tmp_path):
    tokenizer, files, whole = inputs
    out = tmp_path / "out"
    first = start(prepare_args(tokenizer, files, out))
    wait_until(first, lambda: holds_lock(out, first))
    first.send_signal(signal.SIGSTOP)
    try:
        second = run(prepare_args(tokenizer, files, out), expect=1)
    finally:
        first.send_signal(signal.SIGCONT)
    assert_refused_naming(second, first.pid, out)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr
    assert files_of(out) == files_of(whole)  # complete, and no lock file left


def test_parts_lock_themselves_alone(inputs, tmp_path):
    tokenizer, files, whole = inputs
    out = tmp_path / "out"
    part0 = ".switchyard.part-00000-of-00002.lock"
    first = start(prepare_args(tokenizer, files, out, "--part", "0/2"))
    wait_until(first, lambda: holds_lock(out, first, part0))
    first.send_signal(signal.SIGSTOP)
    try:
        # The same part again is refused; the other part runs beside it.
        again = run(prepare_args(tokenizer, files, out, "--part", "0/2"), expect=1)
        other = run(prepare_args(tokenizer, files, out, "--part", "1/2"))
    finally:
        first.send_signal(signal.SIGCONT)
    assert_refused_naming(again, first.pid, out)
    assert part0 in again.stderr
    assert "data merge-parts" in other.stdout
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr
    run([SWITCHYARD, "data", "merge-parts", str(out)])
    for split in ("train", "val"):  # parts cut their shards elsewhere
        assert split_stream(out, split) == split_stream(whole, split), split
    assert not list(out.glob(".switchyard*"))


def hold_lock(directory, name=LOCK):
    """The lock taken by this process, as another writer would hold it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                             "started": "2026-01-01T00:00:00Z", "command": "a test"}).encode())
    return fd


def contents(directory):
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("command", ["train", "prepare", "merge-parts", "to-hf", "from-hf"])
def test_every_writing_command_is_refused_while_another_holds_the_lock(
        command, undisturbed, inputs, tmp_path):
    reference, cache = undisturbed
    tokenizer, files, _ = inputs
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("the first writer's\n")
    args = {
        "train": train_args(out, cache),
        "prepare": prepare_args(tokenizer, files, out),
        "merge-parts": [SWITCHYARD, "data", "merge-parts", str(out)],
        "to-hf": [SWITCHYARD, "convert", "to-hf", str(reference / "checkpoints" / "final"),
                  str(out), "--overwrite"],
        "from-hf": [SWITCHYARD, "convert", "from-hf", str(tmp_path / "hf"), str(out),
                    "--overwrite"],
    }[command]
    if command == "from-hf":
        run([SWITCHYARD, "convert", "to-hf", str(reference / "checkpoints" / "final"),
             str(tmp_path / "hf")])
    fd = hold_lock(out)
    try:
        before = contents(out)
        result = run(args, expect=1)
        assert contents(out) == before
    finally:
        os.close(fd)
    assert_refused_naming(result, os.getpid(), out)
    assert "command: a test); one writer at a time" in result.stderr, result.stderr


NO_LOCKS_SHIM = r"""
#include <errno.h>
int flock(int fd, int operation) { (void)fd; (void)operation; errno = ENOLCK; return -1; }
"""


@pytest.fixture(scope="module")
def no_locks(tmp_path_factory):
    """An LD_PRELOAD library whose flock fails with ENOLCK, as on a file system that cannot
    lock (NFSv3 without lockd)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the flock shim")
    root = tmp_path_factory.mktemp("shim")
    (root / "no_locks.c").write_text(NO_LOCKS_SHIM)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(root / "no_locks.so"),
                    str(root / "no_locks.c")], check=True)
    return root / "no_locks.so"


def test_a_file_system_that_cannot_lock_is_refused_unless_allowed(no_locks, tmp_path):
    out = tmp_path / "out"
    merge = [SWITCHYARD, "data", "merge-parts", str(out)]
    # An ASan build (scripts/sanitize.sh) checks that its runtime comes first among the
    # preloaded libraries; the shim only replaces flock.
    asan = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "verify_asan_link_order=0"]))
    env = {"LD_PRELOAD": no_locks, "ASAN_OPTIONS": asan, "SWITCHYARD_ALLOW_UNLOCKED": None}
    refused = run(merge, expect=1, env=env, timeout=60)
    assert refused.stderr.splitlines() == [
        f"switchyard: error: {out}: the file system cannot lock {out / LOCK} (No locks "
        "available), so nothing would keep a second writer out; write elsewhere, or set "
        "SWITCHYARD_ALLOW_UNLOCKED=1 to write without the lock (docs/launch.md)"]

    allowed = run(merge, expect=None, env={**env, "SWITCHYARD_ALLOW_UNLOCKED": "1"}, timeout=60)
    assert allowed.stdout.startswith(f"warning: {out}: the file system cannot lock "), \
        allowed.stdout
    assert "writing without the lock as SWITCHYARD_ALLOW_UNLOCKED=1 asks" in allowed.stdout
    # Past the lock, merge-parts finds no parts to merge: its own refusal.
    assert allowed.returncode == 1 and "nothing to merge" in allowed.stderr, allowed.stderr
