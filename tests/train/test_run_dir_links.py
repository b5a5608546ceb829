"""Files inside a run directory are never followed out of it (core/runtime/file_util.h,
Links::kRefuse, AtomicFileWriter, fresh_directory): a symbolic link planted at the name of
a file `train` writes there (metrics.jsonl, a `.partial` it writes through, `latest`'s
partial file, the final weights directory and its temporary) is refused or replaced,
never written through, and the file or directory it points to outside is byte-identical
afterwards. A fresh `train` refuses a metrics.jsonl it did not write instead of
truncating it, and replaces one it wrote.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import hashlib
import os
from pathlib import Path

import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE, run

OUTSIDE = b"a file of the user's outside the run directory\n"


def train(world, run_dir, *extra):
    """Trains in run_dir: the exit status and the stderr lines."""
    result = run([SWITCHYARD, *world.train_args(TINY_RECIPE, run_dir, *extra)], expect=None,
                 threads=1)
    return result.returncode, result.stderr.splitlines()


def digest(root):
    root = Path(root)
    if root.is_file():
        return hashlib.sha256(root.read_bytes()).hexdigest()
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def outside(tmp_path):
    """A file and a directory outside the run directory, for links to point at."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_bytes(OUTSIDE)
    (tmp_path / "outside" / "dir").mkdir()
    (tmp_path / "outside" / "dir" / "model.safetensors").write_bytes(OUTSIDE)
    return tmp_path / "outside"


def test_fresh_start_refuses_a_metrics_file_it_did_not_write(world, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    notes = b'{"note": "the user\'s own JSON lines"}\n{"step": 3}\n'
    (run_dir / "metrics.jsonl").write_bytes(notes)
    status, lines = train(world, run_dir)
    assert status == 1 and len(lines) == 1, lines
    assert "metrics.jsonl: was not written by switchyard (line 1 is not one of its records)" \
        in lines[0], lines
    assert (run_dir / "metrics.jsonl").read_bytes() == notes
    assert not (run_dir / "checkpoints").exists()


def test_fresh_start_replaces_a_metrics_file_it_wrote(world, tmp_path):
    run_dir = tmp_path / "run"
    assert train(world, run_dir, "--set", "checkpoint.interval_steps=0")[0] == 0
    (run_dir / "checkpoints").rename(tmp_path / "moved")
    written = (run_dir / "metrics.jsonl").read_bytes()
    (run_dir / "metrics.jsonl").write_bytes(written + b'{"step": 9, "lo')  # torn by a kill
    status, lines = train(world, run_dir)
    assert status == 0, lines
    steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert len(steps) == 2


@pytest.mark.parametrize("name", ["metrics.jsonl", "metrics.jsonl.partial"])
def test_link_at_metrics_refused(world, tmp_path, outside, name):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(outside / "file", run_dir / name)
    status, lines = train(world, run_dir)
    assert status == 1 and len(lines) == 1, lines
    assert f"{name}: is a symbolic link" in lines[0], lines
    assert (outside / "file").read_bytes() == OUTSIDE


def test_link_at_latest_partial_refused(world, tmp_path, outside):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    os.symlink(outside / "file", run_dir / "checkpoints" / "latest.partial")
    status, lines = train(world, run_dir)
    assert status == 1, lines
    assert "latest.partial: is a symbolic link" in lines[-1], lines
    assert (outside / "file").read_bytes() == OUTSIDE


@pytest.mark.parametrize("name", ["final", "final.tmp", "step_2.tmp"])
def test_link_at_a_directory_it_writes_is_replaced(world, tmp_path, outside, name):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    before = digest(outside)
    os.symlink(outside / "dir", run_dir / "checkpoints" / name)
    status, lines = train(world, run_dir)
    assert status == 0, lines
    assert digest(outside) == before
    final = run_dir / "checkpoints" / "final"
    assert final.is_dir() and not final.is_symlink()
    assert sorted(p.name for p in final.iterdir()) == [
        "model.safetensors", "recipe.textproto", "tokenizer.model"]
    assert not (run_dir / "checkpoints" / "final.tmp").exists()
