"""What the Python tests share: the repository's paths, the binaries they run (named by the
environment variables tests/CMakeLists.txt sets), the MPI launcher and its environment,
and `run`, which runs a command and checks how it ended.

conftest.py puts this directory on sys.path for every test; a test file run as a script
adds it itself.

    from sy_testing import SWITCHYARD, TINY_RECIPE, run
    result = run([SWITCHYARD, "train", TINY_RECIPE, ...], ranks=2, threads=1)
"""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = REPO / "recipes" / "tiny.textproto"
CORPUS = REPO / "data" / "corpus" / "tinyshakespeare.txt"
MISTRAL_TEMPLATE = REPO / "data" / "templates" / "mistral.json"

# Open MPI refuses to start ranks as root (CI containers) unless told; the engine reads
# neither variable.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def binary(variable, default=None):
    """The executable the environment variable names (`default` where it is unset). Fails
    the test, or the collection of the module that asks at import, in one line when
    there is none."""
    path = os.environ.get(variable) or default
    if not path:
        pytest.fail(f"{variable} is not set: ctest sets it (tests/CMakeLists.txt) to the binary "
                    "these tests run; by hand, set it to the build's binary", pytrace=False)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"{variable}={path} is not an executable file: build it first",
                    pytrace=False)
    return str(path)


def mpiexec():
    """The MPI launcher: MPIEXEC (ctest's), else mpiexec or mpirun found on PATH."""
    path = os.environ.get("MPIEXEC") or shutil.which("mpiexec") or shutil.which("mpirun")
    if not path:
        pytest.fail("MPIEXEC is not set and neither mpiexec nor mpirun is on PATH: the "
                    "multi-rank runs need an MPI launcher", pytrace=False)
    return path


def __getattr__(name):
    """SWITCHYARD (the engine's binary) and MPIEXEC, looked up when a module imports them,
    so that a test file that needs neither runs without them."""
    if name == "SWITCHYARD":
        return binary("SWITCHYARD")
    if name == "MPIEXEC":
        return mpiexec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def mpirun(ranks, *options):
    """The command line prefix that starts `ranks` processes of what follows under the MPI
    launcher, `options` before -np. --oversubscribe lets more ranks than cores run and
    makes idle ranks yield instead of spin."""
    return [mpiexec(), "--oversubscribe", *options, "-np", str(ranks)]


def environment(threads=None, **variables):
    """The tests' environment with MPI_ENV, OMP_NUM_THREADS=threads when given, and
    `variables` (a None value removes the variable)."""
    env = dict(os.environ, **MPI_ENV)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    for name, value in variables.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


def run(argv, *, ranks=1, expect=0, timeout=300, threads=None, env=None, **options):
    """Runs argv (paths and numbers as strings, bytes as they are), under mpirun(ranks) when
    ranks > 1, in environment(threads, **env), capturing stdout and stderr (as text unless
    text=False); fails unless it exits with status `expect` (any when None) within
    `timeout` seconds (None: no limit). Returns the CompletedProcess. `options` go to
    subprocess.run (cwd, preexec_fn, ...)."""
    command = (mpirun(ranks) if ranks > 1 else []) + [
        a if isinstance(a, (str, bytes)) else str(a) for a in argv]
    options.setdefault("text", True)
    result = subprocess.run(command, capture_output=True, timeout=timeout,
                            env=environment(threads, **(env or {})), **options)
    if expect is not None:
        assert result.returncode == expect, (
            f"`{shlex.join(map(os.fsdecode, command))}` exited {result.returncode}, not "
            f"{expect}:\n{result.stdout}{result.stderr}")
    return result


def rewind(run_dir, step):
    """Makes step_<step> the newest checkpoint of `run_dir`, as if the run had stopped
    there."""
    checkpoints = Path(run_dir) / "checkpoints"
    for entry in checkpoints.iterdir():
        if entry.name.startswith("step_") and int(entry.name[5:]) > step:
            shutil.rmtree(entry)
    (checkpoints / "latest").write_text(f"step_{step}\n")
