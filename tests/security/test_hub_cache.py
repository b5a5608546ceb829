"""`convert from-hf` reads a Hugging Face hub cache snapshot, whose every file is a
symlink into the repo's blobs, as it reads the plain directory: the same weights and
tokenizer. cases_hub.py holds the hub layouts it refuses.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import pytest

from cases_hub import hub_snapshot
from sy_testing import SWITCHYARD, run


def convert(*args):
    run([SWITCHYARD, "convert", *args])


def single_file(world, tmp):
    return world.hf(tmp)


def sharded(world, tmp):
    convert("to-hf", world.weights(tmp), tmp / "sharded", "--max-shard-size", "2MB")
    assert (tmp / "sharded" / "model.safetensors.index.json").exists()
    return tmp / "sharded"


@pytest.mark.parametrize("export", [single_file, sharded])
def test_hub_snapshot_converts_as_the_plain_directory(world, tmp_path, export):
    hf = export(world, tmp_path)
    snapshot = hub_snapshot(hf, tmp_path / "hub")
    assert all((snapshot / p.name).is_symlink() for p in hf.iterdir())
    convert("from-hf", hf, tmp_path / "plain")
    convert("from-hf", snapshot, tmp_path / "from-hub")
    for name in ["model.safetensors", "tokenizer.model"]:
        assert ((tmp_path / "from-hub" / name).read_bytes() ==
                (tmp_path / "plain" / name).read_bytes()), name
