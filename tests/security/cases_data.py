"""Hostile and damaged inputs of the data readers (see hostile.py for the harness)."""
import hashlib
import json
import os

import h5py
import numpy as np

from hostile import Case, h5py_file
from sy_testing import SWITCHYARD, TINY_RECIPE, run


def _train_on(world, tmp, dataset):
    return world.train_args(TINY_RECIPE, tmp / "run", "--set", "data.corpus=",
                            "--set", f"data.dataset={dataset}")


def _index(dataset):
    return json.loads((dataset / "index.json").read_text())


def _write_index(dataset, index):
    (dataset / "index.json").write_text(json.dumps(index, indent=2))


def _first_train_shard(dataset):
    return dataset / _index(dataset)["splits"]["train"][0]["file"]


def _reindex(dataset, shard, **fields):
    """Records the shard's current size and sha256 (and `fields`) in the index, so that
    only the check under test can catch the damage."""
    index = _index(dataset)
    for entry in index["splits"]["train"]:
        if entry["file"] == shard.name:
            data = shard.read_bytes()
            entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), **fields)
    _write_index(dataset, index)


def _edit_index(edit):
    def make(world, tmp):
        dataset = world.dataset(tmp)
        index = _index(dataset)
        edit(index, dataset, tmp)
        _write_index(dataset, index)
        return _train_on(world, tmp, dataset)
    return make


def _inspect_shard_with(edit):
    def make(world, tmp):
        dataset = world.dataset(tmp)
        index = _index(dataset)
        edit(index, dataset, tmp)
        _write_index(dataset, index)
        (tmp / "tokenizer.model").write_bytes((dataset / "tokenizer.model").read_bytes())
        return ["inspect", str(_first_train_shard(dataset))]
    return make


def _set_first_shard_file(name_of):
    def edit(index, dataset, tmp):
        index["splits"]["train"][0]["file"] = name_of(dataset, tmp)
    return _edit_index(edit)


def _outside_symlink(dataset, tmp):
    shard = _first_train_shard(dataset)
    outside = tmp / "outside.h5"
    outside.write_bytes(shard.read_bytes())
    os.symlink(outside, dataset / "link.h5")
    return "link.h5"


def _fifo_shard(dataset, tmp):
    os.mkfifo(dataset / "fifo.h5")
    return "fifo.h5"


def _duplicate_shard(index, dataset, tmp):
    index["splits"]["val"].append(dict(index["splits"]["train"][0]))


def _oversized_index(world, tmp):
    dataset = world.dataset(tmp)
    with open(dataset / "index.json", "r+b") as f:
        f.truncate(200 << 20)
    return _train_on(world, tmp, dataset)


def _damage_shard(damage, reindex=True, command="train"):
    def make(world, tmp):
        dataset = world.dataset(tmp)
        shard = _first_train_shard(dataset)
        fields = damage(shard, tmp) or {}
        if reindex:
            _reindex(dataset, shard, **fields)
        if command == "inspect":
            return ["inspect", str(shard)]
        return _train_on(world, tmp, dataset)
    return make


def _flip_byte(shard, tmp):
    data = bytearray(shard.read_bytes())
    data[len(data) - 100] ^= 0x5A
    shard.write_bytes(bytes(data))


def _ids_beyond_vocab(shard, tmp):
    with h5py_file(shard, "r+") as f:
        f["tokens"][:] = np.iinfo(f["tokens"].dtype).max


def _replace_tokens(make_tokens, libver=("v108", "v108")):
    def damage(shard, tmp):
        with h5py_file(shard, "r+", libver) as f:
            del f["tokens"]
            make_tokens(f, tmp)
    return damage


def _huge_extent(f, tmp):
    f.create_dataset("tokens", shape=(1 << 40,), dtype=np.uint16)


def _external_storage(f, tmp):
    outside = tmp / "outside.bin"
    outside.write_bytes(bytes(2 * 1024))
    f.create_dataset("tokens", shape=(1024,), dtype=np.uint16, external=[(str(outside), 0, 2048)])


def _external_link(f, tmp):
    with h5py_file(tmp / "other.h5", "w") as other:
        other.create_dataset("tokens", data=np.zeros(1024, dtype=np.uint16))
    f["tokens"] = h5py.ExternalLink(str(tmp / "other.h5"), "/tokens")


def _virtual(f, tmp):
    with h5py_file(tmp / "source.h5", "w") as source:
        source.create_dataset("tokens", data=np.zeros(1024, dtype=np.uint16))
    layout = h5py.VirtualLayout(shape=(1024,), dtype=np.uint16)
    layout[:] = h5py.VirtualSource(str(tmp / "source.h5"), "tokens", shape=(1024,))
    f.create_virtual_dataset("tokens", layout)


def _array_attribute(shard, tmp):
    with h5py_file(shard, "r+") as f:
        f.attrs["vocab_size"] = np.full(4000, 1024, dtype=np.int64)


def _variable_length_string(shard, tmp):
    with h5py_file(shard, "r+") as f:
        sha = f.attrs["tokenizer_sha256"]
        del f.attrs["tokenizer_sha256"]
        f.attrs["tokenizer_sha256"] = sha.decode() if isinstance(sha, bytes) else str(sha)


def _falling_doc_offsets(shard, tmp):
    with h5py_file(shard, "r+") as f:
        offsets = f["doc_offsets"][:]
        offsets[1] = offsets[-1] + 5
        f["doc_offsets"][:] = offsets


def _train_with_documents(damage):
    """Trains with document-aware attention, which reads every shard's /doc_offsets."""
    def make(world, tmp):
        dataset = world.dataset(tmp)
        shard = _first_train_shard(dataset)
        damage(shard, tmp)
        _reindex(dataset, shard)
        return _train_on(world, tmp, dataset) + ["--set", "data.document_attention=true"]
    return make


def _tokenizer(damage):
    def make(world, tmp):
        dataset = world.dataset(tmp)
        model = dataset / _index(dataset)["tokenizer_file"]
        model.unlink()
        damage(model)
        return _train_on(world, tmp, dataset)
    return make


def _garbage_model(model):
    model.write_bytes(bytes(range(256)) * 64)


def _other_tokenizer_dataset(world, tmp):
    text = tmp / "text.txt"
    text.write_text("\n\n".join(f"Line {i}: the quick brown fox jumps." for i in range(400)))
    for argv in (["data", "tokenizer", "--input", str(text), "--vocab-size", "300",
                  "--out", str(tmp / "other.model")],
                 ["data", "prepare", "--tokenizer", str(tmp / "other.model"), "--input",
                  str(text), "--out", str(tmp / "other"), "--val-fraction", "0.5"]):
        run([SWITCHYARD, *argv], timeout=None)
    return ["eval", str(world.weights(tmp)), "--data", str(tmp / "other")]


CASES = [
    Case("data-index-wrong-type", "dataset index.json", "vocab_size a string",
         _edit_index(lambda index, d, t: index.update(vocab_size=str(index["vocab_size"]))),
         "field vocab_size must be an integer"),
    Case("data-index-null-field", "dataset index.json", "splits null",
         _edit_index(lambda index, d, t: index.update(splits=None)),
         "field splits must be an object"),
    Case("data-index-missing-field", "dataset index.json", "a shard without sha256",
         _edit_index(lambda index, d, t: index["splits"]["train"][0].pop("sha256")),
         "field splits.train[0].sha256 must be a string"),
    Case("data-index-documents-exceed-tokens", "dataset index.json",
         "a shard listing more documents than tokens",
         _edit_index(lambda index, d, t: index["splits"]["train"][0].update(
             documents=index["splits"]["train"][0]["tokens"] + 1)),
         "field splits.train[0].documents must be an integer in [0, "),
    Case("data-index-shard-listed-twice", "dataset index.json",
         "the first train shard listed again in val", _edit_index(_duplicate_shard),
         "field splits.val[1].file lists"),
    Case("data-index-oversized", "dataset index.json", "a 200 MB sparse file",
         _oversized_index, "allowed"),
    Case("data-shard-dotdot", "dataset index.json", "shard file \"../x.h5\"",
         _set_first_shard_file(lambda d, t: "../x.h5"), "is not a plain file name"),
    Case("data-shard-absolute-path", "dataset index.json", "shard file \"/etc/passwd\"",
         _set_first_shard_file(lambda d, t: "/etc/passwd"), "is not a plain file name"),
    Case("data-shard-symlink-outside", "dataset shard", "a symlink to a copy outside the directory",
         _set_first_shard_file(_outside_symlink), "leads outside"),
    Case("data-shard-fifo", "dataset shard", "a FIFO (would block a reader)",
         _set_first_shard_file(_fifo_shard), "is not a regular file"),
    Case("data-tokenizer-dotdot", "dataset index.json", "tokenizer_file \"../tokenizer.model\"",
         _edit_index(lambda index, d, t: index.update(tokenizer_file="../tokenizer.model")),
         "field tokenizer_file"),
    Case("data-inspect-tokenizer-outside", "dataset index.json (inspect SHARD)",
         "tokenizer_file \"../tokenizer.model\", a model outside the directory",
         _inspect_shard_with(lambda index, d, t: index.update(tokenizer_file="../tokenizer.model")),
         "field tokenizer_file \"../tokenizer.model\" is not a plain file name"),
    Case("data-shard-bit-flip", "dataset shard", "one byte flipped, size unchanged",
         _damage_shard(_flip_byte, reindex=False), "does not match the index"),
    Case("data-shard-token-beyond-vocab", "dataset shard",
         "every token id 65535 (vocab 1024), index sha256 updated to match",
         _damage_shard(_ids_beyond_vocab), "has id 65535, not below vocab_size"),
    Case("data-shard-huge-extent", "dataset shard",
         "/tokens declares 2^40 tokens (contiguous, never written: no data in the file)",
         _damage_shard(_replace_tokens(_huge_extent)),
         "/tokens: its 2199023255552 bytes of data are not inside the file"),
    Case("data-shard-external-storage", "dataset shard",
         "/tokens stored in a file outside the directory (HDF5 external storage)",
         _damage_shard(_replace_tokens(_external_storage)), "keeps its data in external files"),
    Case("data-shard-external-link", "dataset shard", "/tokens an HDF5 external link to another file",
         _damage_shard(_replace_tokens(_external_link)), "is an external link"),
    Case("data-shard-virtual-dataset", "dataset shard", "/tokens a virtual dataset over another file",
         _damage_shard(_replace_tokens(_virtual, libver=("v110", "v110"))),
         "/tokens: is stored as a virtual dataset"),
    Case("data-shard-array-attribute", "token shard (inspect)",
         "vocab_size attribute an array of 4000 values",
         _damage_shard(_array_attribute, reindex=False, command="inspect"),
         "attribute vocab_size: must hold exactly one value"),
    Case("data-shard-variable-length-string", "dataset shard",
         "tokenizer_sha256 a variable-length string (read through libhdf5's global heap)",
         _damage_shard(_variable_length_string),
         "attribute tokenizer_sha256: is a variable-length type, which the engine refuses"),
    Case("data-shard-doc-offsets-falling", "dataset shard (data.document_attention)",
         "/doc_offsets past the token count, then falling, index sha256 updated to match",
         _train_with_documents(_falling_doc_offsets), "/doc_offsets must rise from 0"),
    Case("data-tokenizer-garbage", "dataset tokenizer.model", "16 kB of binary garbage",
         _tokenizer(_garbage_model), "not a SentencePiece model"),
    Case("data-tokenizer-fifo", "dataset tokenizer.model", "a FIFO (would block a reader)",
         _tokenizer(lambda model: os.mkfifo(model)), "is not a regular file"),
    Case("data-other-tokenizer", "dataset for eval",
         "a dataset tokenised with another tokenizer (vocab 300) than the model's",
         _other_tokenizer_dataset, "the dataset was made with tokenizer sha256"),
]
