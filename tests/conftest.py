"""Fixtures that several test files share, each built once a session: the tiny run the
hostile-input harness copies from, tokenizers of the bundled corpus, and the small
datasets made with them. tests/run_pytest.py makes this directory pytest's rootdir, so
that this file is loaded for a test file of any area.

The plain helpers (paths, binaries, the MPI launcher, `run`) are in sy_testing.py, which
this directory on sys.path makes importable; tests/security holds hostile.py, whose tiny
run (`world`) the cli, data and train tests copy too.
"""
import json
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
for path in (TESTS, TESTS / "security"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from sy_testing import CORPUS, MISTRAL_TEMPLATE, run  # noqa: E402


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """A short tiny run's outputs (tests/security/hostile.py), for tests to copy."""
    from hostile import make_world
    return make_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="session")
def corpus_tokenizer(tmp_path_factory):
    """tokenizer(vocab_size, characters=None): the path of a tokenizer of vocab_size pieces
    trained on the bundled corpus (on its first `characters` characters when given)."""
    from sy_testing import SWITCHYARD
    made = {}

    def tokenizer(vocab_size, characters=None):
        if (vocab_size, characters) not in made:
            root = tmp_path_factory.mktemp(f"tokenizer{vocab_size}")
            corpus = CORPUS
            if characters is not None:
                corpus = root / "corpus.txt"
                corpus.write_text(CORPUS.read_text()[:characters])
            run([SWITCHYARD, "data", "tokenizer", "--input", corpus, "--vocab-size", vocab_size,
                 "--out", root / "tok.model"], timeout=600)
            made[vocab_size, characters] = root / "tok.model"
        return made[vocab_size, characters]

    return tokenizer


@pytest.fixture(scope="session")
def prepare_inputs(tmp_path_factory, corpus_tokenizer):
    """The inputs of the `data prepare` resume, part and lock tests: a 512-piece corpus
    tokenizer and three files, each the corpus twice."""
    root = tmp_path_factory.mktemp("prepare_inputs")
    text = CORPUS.read_text()
    files = []
    for name in ("a.txt", "b.txt", "c.txt"):
        files.append(root / name)
        files[-1].write_text(text * 2)
    return corpus_tokenizer(512), files


@pytest.fixture(scope="session")
def chat_dataset(tmp_path_factory, corpus_tokenizer):
    """chats(speeches): instruction data for the padding tests, the first `speeches`
    speeches of the corpus paired as prompt and answer (a fifth held out for validation),
    prepared with the Mistral template and the 1024-piece corpus tokenizer, so that some
    conversations fit a window and some are longer."""
    from sy_testing import SWITCHYARD
    made = {}

    def chats(speeches):
        if speeches not in made:
            root = tmp_path_factory.mktemp(f"chats{speeches}")
            paragraphs = [p for p in CORPUS.read_text().split("\n\n") if p.strip()][:speeches]
            lines = [json.dumps({"prompt": paragraphs[i], "response": paragraphs[i + 1]})
                     for i in range(0, len(paragraphs) - 1, 2)]
            (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
            run([SWITCHYARD, "data", "prepare", "--tokenizer", corpus_tokenizer(1024),
                 "--input", root / "chats.jsonl", "--out", root / "chat",
                 "--val-fraction", "0.2", "--chat-template", MISTRAL_TEMPLATE], timeout=600)
            made[speeches] = root / "chat"
        return made[speeches]

    return chats


@pytest.fixture(scope="session")
def batch_dataset(tmp_path_factory, corpus_tokenizer):
    """(tokenizer, dataset) for the tests of a model's first step: a 320-piece tokenizer
    of the corpus's first 40000 characters, and the next 300 prepared with it, all of
    them training data (a few hundred tokens)."""
    from sy_testing import SWITCHYARD
    root = tmp_path_factory.mktemp("batch")
    (root / "batch.txt").write_text(CORPUS.read_text()[40000:40300])
    tokenizer = corpus_tokenizer(320, 40000)
    run([SWITCHYARD, "data", "prepare", "--tokenizer", tokenizer, "--input", root / "batch.txt",
         "--out", root / "dataset", "--val-fraction", "0"], timeout=600)
    return tokenizer, root / "dataset"
