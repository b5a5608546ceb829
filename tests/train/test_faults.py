"""Faults as routine: kill -9 at many moments, a full disk during a checkpoint save, a rank
killed under mpirun, SIGTERM to mpirun, and non-finite losses. Each run that follows a
fault must resume from a checkpoint (never start afresh) and end bit for bit where a run
that never failed ends.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
import os
import queue
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from run_metrics import losses
from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, environment, mpirun, run

STEPS = 30
RESUMED = re.compile(r"resuming from (\S+) \(step (\d+)\)")


def train_args(run_dir, cache, *extra):
    """A tiny model, a checkpoint after every step: a run of STEPS steps takes seconds."""
    return [SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
            "--dataset-cache", str(cache),
            "--set", f"train.steps={STEPS}", "--set", "optimizer.warmup_steps=2",
            "--set", "train.log_interval=1", "--set", "train.eval_interval=5",
            "--set", "train.eval_batches=1", "--set", "train.global_batch_size=4",
            "--set", "train.micro_batch_size=2", "--set", "model.num_layers=1",
            "--set", "train.seq_len=32", "--set", "checkpoint.interval_steps=1",
            "--set", "checkpoint.keep=2", "--set", "runtime.threads=1", *extra]


def resumed_step(output):
    """The step a run's output says it resumed from; fails on a fresh start."""
    match = RESUMED.search(output)
    assert match, f"the run did not resume from a checkpoint:\n{output}"
    step = int(match.group(2))
    assert step > 0, output
    return step


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache):
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    run(train_args(run_dir, cache))
    return run_dir


class Lines:
    """A process's stdout lines, read on a thread so the test can wait for one."""

    def __init__(self, process):
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")

    def all(self, timeout=60):
        """Every line, once the stream has ended."""
        deadline = time.monotonic() + timeout
        while (line := self.lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def wait_for_path(exists, timeout):
    """Returns when exists() is true, or at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not exists():
        time.sleep(0.001)


KILLS = 24


def wait_to_kill(life, resumed, lines, checkpoints, rng):
    """Waits for a moment two or three steps past the step a life resumed from: every
    other life while it writes a checkpoint (a few milliseconds after step_<N>.tmp
    appears; a killed life may have left step_<resumed + 1>.tmp behind, so N is later),
    the others at a random moment of a step."""
    step = resumed + 2 + rng.randint(0, 1)
    if life % 2 and step <= STEPS:
        wait_for_path((checkpoints / f"step_{step}.tmp").exists, timeout=60)
        time.sleep(rng.uniform(0.0, 0.02))
    elif step <= STEPS:
        lines.wait_for(rf"^step\s+{step}/")
        time.sleep(rng.uniform(0.0, 0.08))


def test_kill_9_at_many_moments_then_resume_is_bit_identical(tmp_path, cache, uninterrupted):
    """KILLS lives each killed at another moment; every rerun must report a resume from
    step N > 0, and the life that finishes matches the reference bit for bit."""
    run_dir = tmp_path / "run"
    rng = random.Random(15)
    previous = 0
    resumes = []
    for life in range(KILLS + 1):
        process = subprocess.Popen(train_args(run_dir, cache), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, env=environment())
        lines = Lines(process)
        if life == 0:
            lines.wait_for(r"saved checkpoint .*step_1$")
            previous = 1
        else:
            step = int(lines.wait_for(RESUMED.pattern).group(2))
            assert step >= previous, f"life {life} resumed from step {step} after {resumes}"
            previous = step
            resumes.append(step)
        if life == KILLS:
            assert process.wait(timeout=300) == 0, "".join(lines.seen)
            break
        wait_to_kill(life, previous, lines, run_dir / "checkpoints", rng)
        process.kill()
        process.wait()
    assert losses(run_dir) == losses(uninterrupted), resumes
    # The kills fell over the whole run, not all near one step (a kill while step N's
    # checkpoint is written resumes from N - 1 again, so some steps repeat).
    assert len(set(resumes)) >= STEPS // 3 and max(resumes) >= STEPS - 10, resumes


def mount_and_run(mount_point, size, cmd, out_dir):
    """Runs cmd with a tmpfs of `size` mounted on mount_point in a private mount namespace,
    then copies what the run left there to out_dir (the tmpfs goes with the namespace)."""
    script = ('mount -t tmpfs -o size="$1" tmpfs "$2" && shift 3 && "$@" > "$OUT/stdout" '
              '2> "$OUT/stderr"; echo $? > "$OUT/rc"; cp -a "$MNT/run" "$OUT/run"')
    env = environment(OUT=out_dir, MNT=mount_point)
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                    size, str(mount_point), "--", *cmd], env=env, check=True, timeout=300)
    return (int((out_dir / "rc").read_text()), (out_dir / "stdout").read_text(),
            (out_dir / "stderr").read_text())


def checkpoint_bytes(run_dir):
    return sum(f.stat().st_size for f in (run_dir / "checkpoints" / f"step_{STEPS}").iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_disk_full_during_a_checkpoint_keeps_the_previous_one(tmp_path, cache, uninterrupted):
    # Room for the run's other files and three checkpoints (keep=5 keeps them all), not
    # for a fourth.
    other = sum(f.stat().st_size for f in uninterrupted.iterdir() if f.is_file())
    one = checkpoint_bytes(uninterrupted)
    size = other * 2 + one * 3 + one // 2
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    rc, stdout, stderr = mount_and_run(
        mount_point, str(size), train_args(mount_point / "run", cache, "--set", "checkpoint.keep=5"),
        out)
    assert rc == 1, stdout + stderr
    saved = [int(s) for s in re.findall(r"saved checkpoint \S+step_(\d+)\n", stdout)]
    assert saved and saved == list(range(1, len(saved) + 1)), stdout
    # One line naming the file of the save that failed and the OS's reason.
    assert stderr.count("\n") == 1 and f"step_{saved[-1] + 1}" in stderr, stderr
    assert "No space left on device" in stderr, stderr
    assert "saved final weights" not in stdout and "wrote" not in stdout, stdout
    run_dir = out / "run"
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{saved[-1]}\n"
    report = run([SWITCHYARD, "inspect", str(run_dir / "checkpoints")]).stdout
    assert f"checkpoint at step {saved[-1]}" in report and "slices verified" in report, report
    resumed = run(train_args(run_dir, cache))
    assert resumed_step(resumed.stdout) == saved[-1]
    assert losses(run_dir) == losses(uninterrupted)


# The launch setting of README's mpirun lines, shortened so that the tests stay quick:
# mpirun sends SIGCONT, waits this long, sends SIGTERM, waits as long again, then SIGKILL.
SIGKILL_TIMEOUT_S = 1


def mpi(ranks, args):
    return mpirun(ranks, "--mca", "odls_base_sigkill_timeout", str(SIGKILL_TIMEOUT_S)) + args


def rank_pids(launcher_pid):
    """world rank -> pid of the launcher's children."""
    pids = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != launcher_pid:
            continue
        for variable in environ:
            if variable.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(variable.split(b"=")[1])] = int(entry.name)
    return pids


# Long enough that a stop requested SIGKILL_TIMEOUT_S after the signal falls inside it
# (about 4 s of steps on an idle 2-core machine); checkpoints only at the end, so the one
# a stop saves is the stop's own.
MPI_STEPS = 300
# Two ranks: expert parallelism, or two pipeline stages of one layer each (a survivor
# then waits in a point-to-point message, not a collective).
MPI_LAYOUTS = {
    "ep2": ["--set", "parallel.expert_parallel_size=2"],
    "pp2": ["--set", "parallel.pipeline_parallel_size=2", "--set", "model.num_layers=2"],
}


def mpi_run(layout):
    return ["--set", f"train.steps={MPI_STEPS}", "--set", "train.log_interval=5",
            "--set", "checkpoint.interval_steps=0", *MPI_LAYOUTS[layout]]


@pytest.fixture(scope="module")
def uninterrupted_np2(tmp_path_factory, cache):
    """layout -> the run of MPI_STEPS steps under it that nothing stopped, run once."""
    runs = {}

    def run_once(layout):
        if layout not in runs:
            runs[layout] = tmp_path_factory.mktemp(f"whole_{layout}") / "run"
            run(mpi(2, train_args(runs[layout], cache, *mpi_run(layout))))
        return runs[layout]

    return run_once


@pytest.mark.parametrize("layout", MPI_LAYOUTS)
@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_ends_every_rank_in_bounded_time(tmp_path, cache, victim, layout):
    process = subprocess.Popen(mpi(2, train_args(tmp_path / "run", cache, *mpi_run(layout))),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=environment())
    lines = Lines(process)
    lines.wait_for(r"^step\s+5/")
    ranks = rank_pids(process.pid)
    assert sorted(ranks) == [0, 1], ranks
    start = time.monotonic()
    os.kill(ranks[victim], signal.SIGKILL)
    # A survivor waits for the dead rank (in a collective, or for the other stage's
    # activations or gradients) until mpirun's SIGKILL.
    bound = 2 * SIGKILL_TIMEOUT_S + 3
    assert process.wait(timeout=bound + 30) != 0
    wait_for_path(lambda: not any(alive(pid) for pid in ranks.values()), timeout=bound + 30)
    elapsed = time.monotonic() - start
    assert elapsed < bound, f"the ranks took {elapsed:.1f} s to end"


def alive(pid):
    """Whether a process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("layout", MPI_LAYOUTS)
def test_sigterm_to_mpirun_checkpoints_one_agreed_step_and_resumes_exactly(
        tmp_path, cache, uninterrupted_np2, layout):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(mpi(2, train_args(run_dir, cache, *mpi_run(layout))),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=environment())
    lines = Lines(process)
    lines.wait_for(r"^step\s+5/")
    process.send_signal(signal.SIGTERM)
    stopped = int(lines.wait_for(r"stopped after step (\d+);", timeout=60).group(1))
    process.wait(timeout=60)
    output = lines.all()
    # The ranks exit 143 after their checkpoint; mpirun exits 1 for a job it was told to end.
    assert process.returncode == 1, output
    # Both ranks took the signal; rank 0 reports the one step they stopped at.
    assert output.count("switchyard: stopping after this step's checkpoint") == 2, output
    assert 5 <= stopped < MPI_STEPS, output
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{stopped}\n"
    resumed = run(mpi(2, train_args(run_dir, cache, *mpi_run(layout))))
    assert resumed_step(resumed.stdout) == stopped
    assert losses(run_dir) == losses(uninterrupted_np2(layout))


def blow_up(lr):
    """Six steps whose first update (at this learning rate) makes step 2 non-finite."""
    return ["--set", "train.steps=6", "--set", "optimizer.warmup_steps=0",
            "--set", f"optimizer.lr={lr}", "--set", "train.eval_interval=0",
            "--set", "checkpoint.keep=10"]


@pytest.mark.parametrize("lr,culprit", [
    ("1e38", "step 2: the loss is nan"),
    ("1e30", "step 2: the gradient of model.embed_tokens.weight is not finite"),
])
def test_non_finite_step_stops_naming_it_and_keeps_the_last_checkpoint(tmp_path, cache, lr,
                                                                        culprit):
    run_dir = tmp_path / "run"
    result = run(train_args(run_dir, cache, *blow_up(lr)), expect=1)
    assert result.stderr.count("\n") == 1 and culprit in result.stderr, result.stderr
    assert re.findall(r"saved checkpoint \S+step_(\d+)\n", result.stdout) == ["1"], result.stdout
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_1"]
    assert (checkpoints / "latest").read_text() == "step_1\n"
    report = run([SWITCHYARD, "inspect", str(checkpoints)]).stdout
    assert "checkpoint at step 1" in report and "slices verified" in report, report


def test_skip_non_finite_steps_counts_them_and_updates_nothing(tmp_path, cache):
    run_dir = tmp_path / "run"
    result = run(train_args(run_dir, cache, *blow_up("1e30"),
                            "--set", "train.skip_non_finite_steps=true"))
    for step in range(2, 7):
        assert (f"skipped step {step}: the gradient of model.embed_tokens.weight is not "
                f"finite ({step - 1} skipped)") in result.stdout, result.stdout
    skipped = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if '"skipped"' in line]
    assert [(m["step"], m["skipped_steps"]) for m in skipped] == [(s, s - 1) for s in range(2, 7)]
    # Every skipped step left the weights and the AdamW state as step 1 made them.
    first = datasets(run_dir / "checkpoints" / "step_1" / "rank_0.h5")
    last = datasets(run_dir / "checkpoints" / "step_6" / "rank_0.h5")
    assert first.keys() == last.keys()
    for name, values in first.items():
        assert np.array_equal(values, last[name]), name


def datasets(path):
    """name -> values of every dataset in an HDF5 file."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, item[()])
                     if isinstance(item, h5py.Dataset) else None)
    return out
