"""The hostile-input harness: one Case per damaged or hostile input in docs/security.md.

A case copies what it needs from a trained tiny run (`World`), damages it, and names the
switchyard command that must refuse it. The command must end with exit status 1 and
exactly one line on stderr containing `expect`, within TIME_LIMIT_S seconds and
MEMORY_LIMIT_BYTES of address space: no crash, hang or unbounded allocation.

The cases live in cases_<area>.py files, each a list CASES.
"""
import dataclasses
import shutil
from pathlib import Path
from typing import Callable, List

from sy_testing import SWITCHYARD, TINY_RECIPE, run

TIME_LIMIT_S = 60
MEMORY_LIMIT_BYTES = 8 << 30
# Short runs of the tiny recipe: two steps, a checkpoint after each.
SHORT_TRAIN = ["--set", "train.steps=2", "--set", "optimizer.warmup_steps=0",
               "--set", "train.eval_interval=0", "--set", "train.log_interval=1",
               "--set", "checkpoint.interval_steps=1", "--set", "checkpoint.keep=5",
               "--set", "model.num_layers=2", "--set", "train.global_batch_size=4",
               "--set", "train.micro_batch_size=4", "--set", "train.seq_len=32"]


@dataclasses.dataclass
class Case:
    id: str            # the row's name in docs/security.md
    input: str         # which input: "safetensors", "checkpoint manifest", ...
    damage: str        # what was done to it, in words
    make: Callable     # make(world, tmp: Path) -> argv after the binary
    expect: str        # a substring of the one-line error
    writes_nothing: bool = False  # the refusal leaves the case's scratch directory as it was


class World:
    """Copies of a trained tiny run's outputs for a case to damage."""

    def __init__(self, root: Path):
        self.root = root

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def run_dir(self, tmp: Path) -> Path:
        """A run directory: metrics.jsonl, checkpoints/step_1, step_2, final, latest."""
        dest = tmp / "run"
        shutil.copytree(self.root / "run", dest, symlinks=True)
        return dest

    def weights(self, tmp: Path) -> Path:
        """A final-weights directory: recipe.textproto, model.safetensors, tokenizer.model."""
        dest = tmp / "weights"
        shutil.copytree(self.root / "run" / "checkpoints" / "final", dest)
        return dest

    def dataset(self, tmp: Path) -> Path:
        """A prepared dataset directory: index.json, tokenizer.model, train and val shards."""
        dest = tmp / "dataset"
        source = next(p for p in self.cache.iterdir() if (p / "index.json").exists())
        shutil.copytree(source, dest)
        return dest

    def hf(self, tmp: Path) -> Path:
        """A Hugging Face export of the final weights (convert to-hf)."""
        dest = tmp / "hf"
        shutil.copytree(self.root / "hf", dest)
        return dest

    def train_args(self, recipe, run_dir, *extra):
        return ["train", str(recipe), "--run-dir", str(run_dir),
                "--dataset-cache", str(self.cache), *SHORT_TRAIN, *extra]


def make_world(root: Path) -> World:
    world = World(root)
    run_dir = root / "run"
    run([SWITCHYARD, *world.train_args(TINY_RECIPE, run_dir)], timeout=600)
    run([SWITCHYARD, "convert", "to-hf", run_dir / "checkpoints" / "final", root / "hf"],
        timeout=600)
    return world


def h5py_file(path, mode, libver=("v108", "v108")):
    """h5py.File writing the layout the engine's HDF5 reader reads (superblock 2, version 2
    object headers: docs/data.md), so that the damage a case makes, not an older layout,
    is what the reader refuses. Virtual datasets need libver v110."""
    import h5py
    return h5py.File(path, mode, libver=libver)


def _limit_memory():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run_refused(argv: List[str]):
    """Runs switchyard; returns (exit status, stderr lines)."""
    result = run([SWITCHYARD, *argv], expect=None, timeout=TIME_LIMIT_S, threads=1,
                 preexec_fn=_limit_memory)
    return result.returncode, result.stderr.splitlines()
