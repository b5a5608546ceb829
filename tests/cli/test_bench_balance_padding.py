"""`switchyard bench balance` on a recipe with data.packing PAD: each window holds one
conversation, padded, and the load it reports is that of the conversations' text alone,
the padding left out as training leaves it out (routed to no expert).

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import json

import h5py
import numpy as np

from sy_testing import SWITCHYARD, TINY_RECIPE, run

SEQ = 128  # the tiny recipe's train.seq_len
BATCH = 8  # its train.micro_batch_size
BATCHES = 2
TOP_K = 2


def train_document_lengths(chat):
    """The train split's documents' lengths, in the dataset's order."""
    index = json.loads((chat / "index.json").read_text())
    lengths = []
    for entry in index["splits"]["train"]:
        with h5py.File(chat / entry["file"], "r") as f:
            lengths.extend(np.diff(f["doc_offsets"][:]).tolist())
    return lengths


def test_padding_is_left_out_of_the_load(tmp_path, chat_dataset):
    chat = chat_dataset(200)
    recipe = tmp_path / "padded.textproto"
    tiny = TINY_RECIPE.read_text()
    corpus = 'corpus: "../data/corpus/tinyshakespeare.txt"'
    assert corpus in tiny
    recipe.write_text(tiny.replace(corpus, f'dataset: "{chat}"\n  packing: PAD'))
    run([SWITCHYARD, "bench", "balance", recipe, "--batches", BATCHES, "--json",
         tmp_path / "b.json"])
    report = json.loads((tmp_path / "b.json").read_text())

    lengths = train_document_lengths(chat)
    windows = BATCHES * BATCH
    assert len(lengths) >= windows
    text = sum(min(length, SEQ) for length in lengths[:windows])
    assert text < windows * SEQ  # some windows are padded
    for layer in report["layers"]:
        assert sum(layer["tokens_per_expert"]) == text * TOP_K
