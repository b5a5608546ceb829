"""Launch on a real Slurm: the test brings up munged, slurmctld and slurmd on localhost and
submits docs/launch.md's one-node script, shortened: a 2-task job of the tiny recipe with
expert parallelism under srun --mpi=pmix. Stopped mid-run by scancel and requeued with
scontrol, or by the SIGTERM a time limit sends and requeued by the script itself, the
job's second life must resume from the checkpoint its ranks saved and end where an
uninterrupted run (mpirun, outside Slurm, same layout) ends, bit for bit.

Needs root (the daemons run as root) and Debian's slurm-wlm and munge (scripts/setup.sh
installs them); skipped otherwise. Run by ctest with the interop Python; SWITCHYARD and
MPIEXEC name the binaries.
"""
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, environment, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from run_metrics import losses  # noqa: E402

PROGRAMS = ["munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol", "sinfo",
            "squeue", "unshare"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the Slurm daemons of this test run as root"),
    pytest.mark.skipif(any(shutil.which(p) is None for p in PROGRAMS),
                       reason="Slurm (slurm-wlm) or munge is not installed; scripts/setup.sh "
                              "installs them"),
]

# Long enough that the cancel, sent once metrics.jsonl shows step 5, lands mid-run (a
# few seconds of steps on an idle 2-core machine); a periodic checkpoint every 100 steps,
# so the one the requeued job resumes from is the cancel's own unless the cancel came late.
STEPS = 400
TRAIN = ["--set", f"train.steps={STEPS}", "--set", "optimizer.warmup_steps=2",
         "--set", "train.log_interval=5", "--set", "train.eval_interval=100",
         "--set", "train.eval_batches=1", "--set", "train.global_batch_size=4",
         "--set", "train.micro_batch_size=2", "--set", "model.num_layers=1",
         "--set", "train.seq_len=32", "--set", "checkpoint.interval_steps=100",
         "--set", "checkpoint.keep=2", "--set", "runtime.threads=1",
         "--set", "parallel.expert_parallel_size=2"]
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
RESUMED = re.compile(r"resuming from (\S+) \(step (\d+)\)")
STOPPED = re.compile(r"stopped after step (\d+);")


def train_args(run_dir, cache):
    return [SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
            "--dataset-cache", str(cache), *TRAIN]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def slurm_conf(root, munge):
    """A one-node cluster on localhost: no cgroups (proctrack/linuxproc, task/none), state
    and temporary files (the PMIx plugin's, named by job id) in `root`, ports picked free,
    and requeued jobs eligible after 5 s instead of 120 (cred_expire) with the scheduler
    looking every second."""
    return f"""\
ClusterName=switchyard-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}/munge.socket,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
TmpFS={root}/tmp
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=20
SchedulerParameters=sched_interval=1,bf_interval=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


# Run inside a PID namespace of their own (with its own /proc, which proctrack/linuxproc
# reads), so that ending its first process ends every daemon, step daemon and task of the
# cluster at once. A daemon that exits ends the namespace, and the test with its logs.
DAEMONS_SCRIPT = """\
munged -F --key-file="$MUNGE/munge.key" --socket="$MUNGE/munge.socket" \\
    --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" \\
    --seed-file="$MUNGE/munged.seed" > "$ROOT/munged.out" 2>&1 &
for _ in $(seq 100); do [ -S "$MUNGE/munge.socket" ] && break; sleep 0.1; done
slurmctld -D -i > "$ROOT/slurmctld.out" 2>&1 &
slurmd -D -N localhost > "$ROOT/slurmd.out" 2>&1 &
wait -n
"""


class Slurm:
    """A one-node cluster whose daemons are the test's, and the variables (env) with which
    the Slurm commands talk to them."""

    def __init__(self, root):
        self.root = root
        # munged wants every directory above its socket open to all, which pytest's
        # temporary directories are not.
        self.munge = Path(tempfile.mkdtemp(prefix="switchyard-munge-"))
        self.conf = root / "slurm.conf"
        self.env = {"SLURM_CONF": self.conf}
        self.daemons = None

    def start(self):
        for d in ("state", "spool", "tmp"):
            (self.root / d).mkdir()
        self.munge.chmod(0o755)
        key = self.munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(slurm_conf(self.root, self.munge))
        self.daemons = subprocess.Popen(
            ["unshare", "--pid", "--mount-proc", "--kill-child=SIGKILL", "bash", "-c",
             DAEMONS_SCRIPT], env=environment(**self.env, ROOT=self.root, MUNGE=self.munge),
            preexec_fn=die_with_parent)
        self.wait_for(lambda: self.command("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
                      == "idle", 60, "sinfo to show the node idle")

    def wait_for(self, condition, timeout, what):
        """wait_until, failing at once with the daemons' logs when one has died."""
        def ready():
            if self.daemons.poll() is not None:
                logs = "".join(f"{log.name}:\n{log.read_text()[-3000:]}"
                               for log in sorted(self.root.glob("*.out")) +
                               sorted(self.root.glob("*.log")))
                raise AssertionError(f"a Slurm daemon exited:\n{logs}")
            return condition()
        wait_until(ready, timeout, what)

    def command(self, *argv, check=True):
        return run(argv, expect=0 if check else None, timeout=60, env=self.env)

    def job_state(self, job):
        out = self.command("scontrol", "show", "job", job).stdout
        return re.search(r"JobState=(\S+)", out).group(1)

    def wait_for_end(self, job, timeout):
        """The state a job ended in, once none of its processes is left."""
        self.wait_for(lambda: self.job_state(job) in ENDED and not self.command(
            "squeue", "-h", "-j", job, check=False).stdout.strip(), timeout,
            f"job {job} to end")
        return self.job_state(job)

    def stop(self):
        """Ends the namespace: the daemons, and whatever job is still running."""
        if self.daemons is not None:
            self.daemons.kill()
            self.daemons.wait()
        shutil.rmtree(self.munge, ignore_errors=True)


def die_with_parent():
    """The cluster gets SIGKILL when the test process ends, even when it is killed (a
    ctest timeout) before its finalizers run."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """The same run under mpirun, outside Slurm, never stopped."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run(train_args(run_dir, cache), ranks=2)
    return run_dir


def job_script(run_dir, cache, output):
    """The one-node script of docs/launch.md, shortened to the test's run."""
    train = " ".join(train_args(run_dir, cache))
    return f"""#!/bin/bash
#SBATCH --job-name=switchyard-test
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=1
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={output}
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
echo "job $SLURM_JOB_ID start, restart ${{SLURM_RESTART_COUNT:-0}}"
srun --mpi=pmix --kill-on-bad-exit=1 {train}
status=$?
if [ "$status" -eq 143 ]; then scontrol requeue "$SLURM_JOB_ID"; fi
exit "$status"
"""


def last_logged_step(run_dir):
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [int(m.group(1)) for line in lines if (m := re.match(r'\{"step": ?(\d+)', line))]
    return max(steps, default=0)


def lives(output):
    """The job log cut at each start of the script: one piece per run of the job."""
    return re.split(r"(?m)^(?=job \d+ start, restart \d+$)", output.read_text())[1:]


def submit_and_stop(slurm, tmp_path, cache, *stop):
    """Submits the job, sends `stop` (an scancel command) once it has logged step 5, and
    checks what the stopped life printed; returns the job id, its log and the step
    every rank stopped after."""
    run_dir = tmp_path / "run"
    output = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(job_script(run_dir, cache, output))
    job = slurm.command("sbatch", "--parsable", str(script)).stdout.strip().split(";")[0]
    slurm.wait_for(lambda: last_logged_step(run_dir) >= 5, 120, "the job's first steps")
    slurm.command(*stop, job)
    slurm.wait_for(lambda: STOPPED.search(output.read_text()), 60, "the job to stop")
    first = lives(output)[0]
    stopped = int(STOPPED.search(first).group(1))
    assert 5 <= stopped < STEPS, first
    # Both tasks took the SIGTERM and saved the step that rank 0 reports.
    assert first.count("switchyard: stopping after this step's checkpoint") == 2, first
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{stopped}\n"
    # The start block: layout and where each rank runs.
    assert "2 ranks (dp 2, tp 1, ep 2, pp 1, zero 0)" in first, first
    assert re.search(rf"hosts: ranks 0-1 on {re.escape(socket.gethostname())}\n", first), first
    return job, output, stopped


def check_resumed(slurm, job, output, stopped, reference):
    """The job's second life resumed from `stopped`, finished, and logged the
    uninterrupted run's losses."""
    state = slurm.wait_for_end(job, 180)
    runs = lives(output)
    assert state == "COMPLETED" and len(runs) == 2, output.read_text()
    assert runs[1].startswith(f"job {job} start, restart 1"), runs[1]
    resumed = RESUMED.search(runs[1])
    assert resumed and int(resumed.group(2)) == stopped, runs[1]
    assert losses(output.parent / "run") == losses(reference)


def test_scancel_then_requeue_resumes_and_matches_an_uninterrupted_run(slurm, cache, reference,
                                                                          tmp_path):
    start = time.monotonic()
    job, output, stopped = submit_and_stop(slurm, tmp_path, cache, "scancel")
    # scancel also ends the batch shell: the job stays cancelled, no self-requeue.
    assert slurm.wait_for_end(job, 60) == "CANCELLED", output.read_text()
    # A cancelled job of a --requeue script goes back to the queue under the same id.
    slurm.command("scontrol", "requeue", job)
    check_resumed(slurm, job, output, stopped, reference)
    print(f"scancel + requeue: {time.monotonic() - start:.1f} s")


def test_time_limit_signal_requeues_the_job_which_resumes(slurm, cache, reference, tmp_path):
    """scancel --signal=TERM sends what --signal=TERM@120 sends before the time limit: a
    SIGTERM to the tasks only. The ranks exit 143 after their checkpoint and the script
    requeues its own job."""
    start = time.monotonic()
    job, output, stopped = submit_and_stop(slurm, tmp_path, cache, "scancel", "--signal=TERM")
    check_resumed(slurm, job, output, stopped, reference)
    print(f"signal + self-requeue: {time.monotonic() - start:.1f} s")
