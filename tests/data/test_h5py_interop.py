"""Token data against independent implementations: shards written by h5py (as a user
following docs/data.md would) are read back exactly by the engine's loader, and h5py
layouts outside the engine's HDF5 subset are refused in one line; shards the engine
writes read cleanly in h5py; tokenizer models the engine trains give the same ids in the
sentencepiece Python package.

Run by ctest with the interop environment's Python; TOKEN_TOOL names tests/data/token_tool.
"""
import hashlib
import json

import h5py
import numpy as np
import pytest
import sentencepiece as spm

from sy_testing import CORPUS, SWITCHYARD, TINY_RECIPE as RECIPE, binary, run

TOOL = binary("TOKEN_TOOL")
SEQ = 32
# The h5py file format docs/data.md asks for: superblock 2 and version 2 object headers,
# the subset of HDF5 the engine's reader reads.
LIBVER = ("v108", "v108")


def tool(*args, expect_ok=True):
    result = run([TOOL, *args], expect=0 if expect_ok else 1, timeout=None)
    if expect_ok:
        return json.loads(result.stdout) if result.stdout.strip() else None
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()[:120_000]
    text = text[: text.rindex("\n\n") + 1]
    (root / "corpus.txt").write_text(text, encoding="utf-8")
    tool("train", root / "tok.model", 600, root / "corpus.txt")
    return root


@pytest.fixture(scope="module")
def sp(work):
    return spm.SentencePieceProcessor(model_file=str(work / "tok.model"))


def write_shard(path, ids, doc_ends, vocab_size, sha, dtype=np.uint16, libver=LIBVER,
                **tokens_options):
    """A shard as docs/data.md writes it; `libver` and `tokens_options` (h5py's
    create_dataset keywords for /tokens) depart from it."""
    with h5py.File(path, "w", libver=libver) as f:
        f.create_dataset("tokens", data=np.asarray(ids, dtype=dtype), **tokens_options)
        f.create_dataset("doc_offsets", data=np.asarray([0] + doc_ends, dtype=np.int64))
        f.attrs["format_version"] = 3
        f.attrs["tokenizer_sha256"] = np.bytes_(sha)
        f.attrs["vocab_size"] = vocab_size
        f.attrs["eos_id"] = 2


def write_index(directory, splits, vocab_size, sha):
    index = {"format": "switchyard-tokens", "format_version": 3, "tokenizer_sha256": sha,
             "vocab_size": vocab_size, "splits": {}}
    for split, files in splits.items():
        entries = []
        for name in files:
            path = directory / name
            with h5py.File(path, "r") as f:
                tokens, documents = len(f["tokens"]), len(f["doc_offsets"]) - 1
            data = path.read_bytes()
            entries.append({"file": name, "tokens": tokens, "documents": documents,
                            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        index["splits"][split] = entries
    (directory / "index.json").write_text(json.dumps(index, indent=2))


def test_trained_model_matches_python_sentencepiece(work, sp):
    assert sp.get_piece_size() == 600
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)
    assert sp.id_to_piece(4) == "<0x00>" and sp.id_to_piece(259) == "<0xFF>"
    sample = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
              "  Caf\u00e9, na\u00efve, \u65e5\u672c\u8a9e, 2024 tokens\ttabbed.\n")
    (work / "sample.txt").write_text(sample, encoding="utf-8")
    ids = tool("encode", work / "tok.model", work / "sample.txt")
    assert ids == sp.encode(sample)
    assert sp.decode(ids) == sample


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_encoding_a_corpus_matches_python_sentencepiece(work, model_type):
    # The engine encodes word by word through a cache; the ids must still be
    # SentencePiece's own for the whole text.
    model = work / f"{model_type}.model"
    tool("train", model, 800, work / "corpus.txt", model_type)
    text = (work / "corpus.txt").read_text(encoding="utf-8")
    text += "  double  spaces,\ttabs,\n\n\nblank lines and 12345 digits  \n"
    (work / "whole.txt").write_text(text, encoding="utf-8")
    ids = tool("encode", model, work / "whole.txt")
    assert ids == spm.SentencePieceProcessor(model_file=str(model)).encode(text)


def test_loader_reads_h5py_shards(work, sp):
    paragraphs = [p for p in (work / "corpus.txt").read_text(encoding="utf-8").split("\n\n") if p]
    sha = hashlib.sha256((work / "tok.model").read_bytes()).hexdigest()
    data = work / "from_h5py"
    data.mkdir()
    streams = []
    # h5py's oldest 1.8-format bound (superblock 2) and its newest ("latest": superblock 3).
    for shard, (docs, libver, superblock) in enumerate([(paragraphs[:300], LIBVER, 2),
                                                        (paragraphs[300:], "latest", 3)]):
        ids, ends = [], []
        for doc in docs:
            ids += sp.encode(doc) + [sp.eos_id()]
            ends.append(len(ids))
        streams.append(ids)
        path = data / f"train-{shard:05d}-of-00002.h5"
        write_shard(path, ids, ends, 600, sha, libver=libver)
        assert path.read_bytes()[8] == superblock
    write_index(data, {"train": ["train-00000-of-00002.h5", "train-00001-of-00002.h5"]}, 600, sha)

    stream = streams[0] + streams[1]
    assert tool("read", data, "train") == stream
    assert tool("inspect", data) == {"shards": 2, "tokens": len(stream)}

    windows = (len(stream) - 1) // SEQ
    ranks = [tool("windows", data, SEQ, 5, 8, r, 2, 2 * windows // 2) for r in range(2)]
    starts = []
    for step in range(windows // 4):  # 8 windows a step, 4 from each rank
        for rank in range(2):
            for window in ranks[rank][step * 4:(step + 1) * 4]:
                # Every window is seq_len + 1 consecutive tokens at a multiple of seq_len.
                start = next(s for s in range(0, len(stream), SEQ) if stream[s:s + SEQ + 1] == window)
                starts.append(start // SEQ)
    first_epoch = starts[:windows]
    assert sorted(first_epoch) == list(range(windows))
    assert first_epoch != list(range(windows))


def test_engine_trains_on_h5py_shards(work, sp):
    """Shards a user writes with h5py from their own tokenizer's ids are a dataset that
    `switchyard train` trains and evaluates on."""
    paragraphs = [p for p in (work / "corpus.txt").read_text(encoding="utf-8").split("\n\n") if p]
    sha = hashlib.sha256((work / "tok.model").read_bytes()).hexdigest()
    data = work / "train_from_h5py"
    data.mkdir()
    for split, docs in [("train", paragraphs[:-40]), ("val", paragraphs[-40:])]:
        ids, ends = [], []
        for doc in docs:
            ids += sp.encode(doc) + [sp.eos_id()]
            ends.append(len(ids))
        write_shard(data / f"{split}-00000-of-00001.h5", ids, ends, 600, sha)
    write_index(data, {"train": ["train-00000-of-00001.h5"], "val": ["val-00000-of-00001.h5"]},
                600, sha)
    run_dir = work / "run"
    run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, "--set", f"data.dataset={data}",
         "--set", "data.corpus=", "--set", "model.vocab_size=600", "--set", "train.steps=4",
         "--set", "optimizer.warmup_steps=1", "--set", "train.eval_interval=2",
         "--set", "train.eval_batches=1"], timeout=None)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [m["val_loss"] for m in metrics if "val_loss" in m]
    assert len(evals) == 3 and all(np.isfinite(evals))
    assert evals[-1] < evals[0]


def test_bad_h5py_shards_are_one_line_errors(work):
    data = work / "bad"
    data.mkdir()
    write_shard(data / "train-00000-of-00001.h5", [5, 7, 600, 3], [4], 600, "x")
    write_index(data, {"train": ["train-00000-of-00001.h5"]}, 600, "x")
    err = tool("inspect", data, expect_ok=False)
    assert "train-00000-of-00001.h5: token 2 has id 600, not below vocab_size 600" in err

    with h5py.File(data / "train-00000-of-00001.h5", "a", libver=LIBVER) as f:
        del f.attrs["vocab_size"]
    err = tool("inspect", data / "train-00000-of-00001.h5", expect_ok=False)
    assert "attribute vocab_size is missing" in err

    write_shard(data / "train-00000-of-00001.h5", [5, 7], [1], 600, "x", dtype=np.int32)
    err = tool("inspect", data / "train-00000-of-00001.h5", expect_ok=False)
    assert "/tokens must be uint16 or uint32" in err


@pytest.mark.parametrize("libver, tokens_options, expected", [
    ("earliest", {}, "HDF5 superblock version 0, which the engine does not read (it reads "
                     "superblock 2 or 3: write the file again with this version of the engine, "
                     "or with h5py's libver=(\"v108\", \"v108\")"),
    (LIBVER, {"chunks": True}, "/tokens: is stored in chunks; the engine reads contiguous"),
    (LIBVER, {"maxshape": (None,)}, "/tokens: is stored in chunks"),
    (LIBVER, {"compression": "gzip"}, "/tokens: uses HDF5 filters, which the engine does not"),
], ids=["h5py-defaults", "chunks", "maxshape", "gzip"])
def test_h5py_layouts_outside_the_engines_subset_are_one_line_errors(
        tmp_path, libver, tokens_options, expected):
    """What h5py writes by default (superblock 0), and chunked, resizable or compressed
    /tokens, which the engine's HDF5 reader does not read."""
    write_shard(tmp_path / "train-00000-of-00001.h5", [5, 7, 2], [3], 600, "x", libver=libver,
                **tokens_options)
    write_index(tmp_path, {"train": ["train-00000-of-00001.h5"]}, 600, "x")
    assert f"train-00000-of-00001.h5: {expected}" in tool("inspect", tmp_path, expect_ok=False)


def test_h5py_reads_engine_shards(work, sp):
    data = work / "from_engine"
    tool("prepare", work / "tok.model", data, work / "corpus.txt", 0.1, 20000)
    index = json.loads((data / "index.json").read_text())
    assert index["vocab_size"] == 600
    assert index["special_ids"] == {"unk": 0, "bos": 1, "eos": 2, "pad": 3}
    total = 0
    for entry in index["splits"]["train"] + index["splits"]["val"]:
        path = data / entry["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        with h5py.File(path, "r") as f:
            tokens = f["tokens"][:]
            offsets = f["doc_offsets"][:]
            assert tokens.dtype == np.uint16
            assert f.attrs["tokenizer_sha256"].decode() == index["tokenizer_sha256"]
            assert f.attrs["vocab_size"] == 600 and f.attrs["eos_id"] == 2
            assert offsets[0] == 0 and offsets[-1] == len(tokens) == entry["tokens"]
            # Each document ends with eos and decodes to a paragraph of the corpus.
            assert all(tokens[end - 1] == 2 for end in offsets[1:])
            first = sp.decode(tokens[: offsets[1] - 1].tolist())
            assert first and "\n\n" not in first and first in (work / "corpus.txt").read_text()
        total += entry["tokens"]
    assert total > 20000
