"""A directory output is complete or absent (core/runtime/output_paths.h,
StagedDirectory): `convert to-hf`, `from-hf` and `upcycle` write into a temporary sibling
of the output and rename it into place at the end. A conversion that fails after it has
started writing (here a write refused by RLIMIT_FSIZE, as a full disk would) leaves no
output directory and no temporary, and an earlier output kept with --overwrite
byte-identical; a successful one leaves exactly its files, and removes a temporary a
killed writer left.

Run by ctest with the interop Python; SWITCHYARD names the binary. The inputs come from a
short tiny run (tests/security/hostile.py).
"""
import hashlib
import resource
from pathlib import Path

import pytest

from cases_upcycle import _dense
from sy_testing import SWITCHYARD, run

# Less than the tiny model's embedding (512 KiB in f32), which every conversion writes
# first: the write fails part of the way into the weights.
FILE_SIZE_LIMIT = 256 * 1024
SHARD = ["--max-shard-size", "600KB"]
USER_FILE = b"notes the user keeps beside an export\n"


def convert(*args, file_size_limit=None):
    def limit():
        if file_size_limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    # restore_signals=False keeps SIGXFSZ ignored, as Python has it: a write past the limit
    # fails with EFBIG instead of killing the process.
    return run([SWITCHYARD, "convert", *args], expect=None, threads=1, preexec_fn=limit,
               restore_signals=False)


def snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "directory" for p in sorted(Path(root).rglob("*"))}


def leftovers(parent, name):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.partial-"))


def late_limit(weights, tmp):
    """A file size limit that the sharded export's first shard fits and a later one does
    not: the export fails after it has written whole files."""
    assert convert("to-hf", weights, tmp / "reference", *SHARD).returncode == 0
    sizes = [p.stat().st_size for p in sorted((tmp / "reference").glob("model-*"))]
    assert sizes[0] < max(sizes), sizes
    return max(sizes) - 1


def _to_hf(world, tmp):
    weights = world.weights(tmp)
    return ["to-hf", weights, *SHARD], late_limit(weights, tmp)


def _from_hf(world, tmp):
    return ["from-hf", world.hf(tmp)], FILE_SIZE_LIMIT


def _upcycle(world, tmp):
    return ["upcycle", _dense(world, tmp), "--experts", "4", "--top-k", "2"], FILE_SIZE_LIMIT


def argv_with_output(args, out):
    return [args[0], args[1], out, *args[2:]]


COMMANDS = {"to-hf": _to_hf, "from-hf": _from_hf, "upcycle": _upcycle}


@pytest.mark.parametrize("name", COMMANDS)
def test_failure_after_writing_leaves_nothing(name, world, tmp_path):
    args, limit = COMMANDS[name](world, tmp_path)
    parent = tmp_path / "outputs"
    parent.mkdir()
    result = convert(*argv_with_output(args, parent / "out"), file_size_limit=limit)
    assert result.returncode == 1, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "File too large" in result.stderr, result.stderr
    assert list(parent.iterdir()) == []


@pytest.mark.parametrize("name", COMMANDS)
def test_success_leaves_exactly_its_files(name, world, tmp_path):
    args, _ = COMMANDS[name](world, tmp_path)
    parent = tmp_path / "outputs"
    parent.mkdir()
    stale = parent / ".out.partial-999999-0"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"a killed writer's half")
    result = convert(*argv_with_output(args, parent / "out"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in parent.iterdir()) == ["out"]
    files = sorted(p.name for p in (parent / "out").iterdir())
    if name == "to-hf":
        shards = [f for f in files if f.endswith("safetensors")]
        assert len(shards) >= 2 and all(f.startswith("model-") for f in shards), files
        assert sorted(set(files) - set(shards)) == [
            "config.json", "generation_config.json", "model.safetensors.index.json",
            "special_tokens_map.json", "tokenizer.model", "tokenizer_config.json"]
    else:
        assert files == ["model.safetensors", "recipe.textproto", "tokenizer.model"]


def test_overwrite_failing_late_keeps_the_earlier_export(world, tmp_path):
    weights = world.weights(tmp_path)
    out = tmp_path / "out"
    assert convert("to-hf", weights, out, "--max-shard-size", "3MB").returncode == 0
    (out / "notes.txt").write_bytes(USER_FILE)
    before = snapshot(out)
    result = convert("to-hf", weights, out, *SHARD, "--overwrite",
                     file_size_limit=late_limit(weights, tmp_path))
    assert result.returncode == 1, result.stderr
    assert snapshot(out) == before
    assert leftovers(tmp_path, "out") == []


def test_overwrite_replaces_its_files_and_keeps_the_others(world, tmp_path):
    weights = world.weights(tmp_path)
    out = tmp_path / "out"
    assert convert("to-hf", weights, out, *SHARD).returncode == 0
    (out / "notes.txt").write_bytes(USER_FILE)
    result = convert("to-hf", weights, out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "notes.txt",
        "special_tokens_map.json", "tokenizer.model", "tokenizer_config.json"]
    assert (out / "notes.txt").read_bytes() == USER_FILE
    assert leftovers(tmp_path, "out") == []
