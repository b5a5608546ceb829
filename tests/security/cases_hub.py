"""Hostile Hugging Face hub cache snapshots (see hostile.py for the harness).

A hub cache keeps a model's files in `<repo>/blobs/<hash>` and links each from
`<repo>/snapshots/<revision>/<name>` as `../../blobs/<hash>`. `convert from-hf` accepts
exactly that: a name may resolve to a regular file directly inside a real `<repo>/blobs`.
"""
import hashlib
import json
import os
import shutil
import struct

from hostile import Case

REVISION = "3f1c2a9e"


def hub_snapshot(hf, cache):
    """A hub cache under `cache` holding a copy of the files of `hf` the way the hub keeps
    them; returns the snapshot directory."""
    repo = cache / "models--switchyard--tiny"
    blobs = repo / "blobs"
    snapshot = repo / "snapshots" / REVISION
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for path in sorted(hf.iterdir()):
        blob = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blobs / blob)
        os.symlink(f"../../blobs/{blob}", snapshot / path.name)
    return snapshot


def _from_hub(damage):
    """An import of a hub snapshot of the exported run after damage(repo, snapshot, tmp)."""
    def make(world, tmp):
        snapshot = hub_snapshot(world.hf(tmp), tmp / "hub")
        damage(snapshot.parent.parent, snapshot, tmp)
        return ["convert", "from-hf", str(snapshot), str(tmp / "imported")]
    return make


def _relink(snapshot, name, target):
    (snapshot / name).unlink()
    os.symlink(target, snapshot / name)


def _tokenizer_beside_blobs(repo, snapshot, tmp):
    stash = repo / "stash"
    stash.mkdir()
    shutil.copyfile(snapshot / "tokenizer.model", stash / "tokenizer.model")
    _relink(snapshot, "tokenizer.model", "../../blobs/../stash/tokenizer.model")


def _blobs_symlinked(repo, snapshot, tmp):
    elsewhere = tmp / "elsewhere"
    shutil.copytree(repo / "blobs", elsewhere)
    shutil.rmtree(repo / "blobs")
    os.symlink(elsewhere, repo / "blobs")


def _shard_blob_fifo(repo, snapshot, tmp):
    with open(snapshot / "model.safetensors", "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    weight_map = {name: "shard.safetensors" for name in header if name != "__metadata__"}
    (repo / "blobs" / "index-hash").write_text(json.dumps({"weight_map": weight_map}))
    (snapshot / "model.safetensors").unlink()
    os.symlink("../../blobs/index-hash", snapshot / "model.safetensors.index.json")
    os.mkfifo(repo / "blobs" / "fifo-hash")
    os.symlink("../../blobs/fifo-hash", snapshot / "shard.safetensors")


CASES = [
    Case("hub-tokenizer-beside-blobs", "HF hub cache snapshot",
         "tokenizer.model linked to ../../blobs/../stash/tokenizer.model, a file in the repo "
         "but not in blobs", _from_hub(_tokenizer_beside_blobs), "leads outside"),
    Case("hub-blobs-symlinked", "HF hub cache snapshot",
         "the repo's blobs directory a symlink to a directory elsewhere",
         _from_hub(_blobs_symlinked), "leads outside"),
    Case("hub-shard-blob-fifo", "HF hub cache snapshot",
         "a shard linked to a blob that is a FIFO", _from_hub(_shard_blob_fifo),
         "is not a regular file"),
]
