"""Instruction data and blends end to end. A chat set prepared with the shipped Mistral
template trains on its answers only: the engine's evaluation of a masked validation split
equals the mean cross-entropy transformers gives over the unmasked targets of the same
windows, read from the shard with h5py; one step's loss is the same under 1 and 2
data-parallel ranks. A blend of the plain corpus and the chat set reports tokens and
validation loss per source, `inspect` describes it, and a blend run stopped and resumed
under another layout ends where the uninterrupted run does.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from sy_testing import CORPUS, MISTRAL_TEMPLATE, REPO, SWITCHYARD, TINY_RECIPE as RECIPE, run

BLEND = REPO / "recipes" / "tiny-blend.textproto"
SEQ = 32
SMALL = ["--set", "model.num_layers=2", "--set", f"train.seq_len={SEQ}",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1",
         "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2"]


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def speeches():
    """Pairs of consecutive speeches of the corpus: a prompt and its answer."""
    paragraphs = [p for p in CORPUS.read_text().split("\n\n") if p.strip()][:400]
    return [(paragraphs[i], paragraphs[i + 1]) for i in range(0, len(paragraphs) - 1, 2)]


@pytest.fixture(scope="module")
def data(tmp_path_factory, corpus_tokenizer):
    """The corpus prepared with a tokenizer, and a chat set in both record shapes."""
    root = tmp_path_factory.mktemp("data")
    tokenizer = corpus_tokenizer(1024)
    run([SWITCHYARD, "data", "prepare", "--tokenizer", tokenizer, "--input", CORPUS,
         "--out", root / "corpus", "--val-fraction", "0.05"], threads=1, timeout=600)
    lines = []
    for i, (prompt, answer) in enumerate(speeches()):
        if i % 2:
            lines.append(json.dumps({"prompt": prompt, "response": answer}))
        else:
            lines.append(json.dumps({"messages": [{"role": "user", "content": prompt},
                                                  {"role": "assistant", "content": answer}]}))
    (root / "chats.jsonl").write_text("\n".join(lines) + "\n")
    run([SWITCHYARD, "data", "prepare", "--tokenizer", tokenizer,
         "--input", root / "chats.jsonl", "--out", root / "chat", "--val-fraction", "0.2",
         "--chat-template", MISTRAL_TEMPLATE], threads=1, timeout=600)
    return root


def train(run_dir, *extra, ranks=1):
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, *SMALL, *extra], ranks=ranks,
               threads=1, timeout=600)


def chat_run(run_dir, data, *extra, ranks=1):
    return train(run_dir, "--set", "data.corpus=", "--set", f"data.dataset={data / 'chat'}",
                 "--set", "train.steps=2", "--set", "train.eval_interval=2", *extra, ranks=ranks)


def masked_windows(shard_paths, windows):
    """The first `windows` windows of the split's stream: ids, and targets with -100
    where the loss mask is 0."""
    tokens, mask = [], []
    for path in shard_paths:
        with h5py.File(path, "r") as f:
            tokens.append(f["tokens"][:].astype(np.int64))
            mask.append(f["loss_mask"][:])
    tokens, mask = np.concatenate(tokens), np.concatenate(mask)
    windows = min(windows, (len(tokens) - 1) // SEQ)
    ids = np.stack([tokens[w * SEQ:w * SEQ + SEQ] for w in range(windows)])
    targets = np.stack([np.where(mask[w * SEQ + 1:w * SEQ + SEQ + 1] == 1,
                                 tokens[w * SEQ + 1:w * SEQ + SEQ + 1], -100)
                        for w in range(windows)])
    return ids, targets


def test_masked_evaluation_equals_transformers_on_the_same_shard(data, tmp_path):
    chat_run(tmp_path / "run", data)
    final = tmp_path / "run" / "checkpoints" / "final"
    report = json.loads(run([SWITCHYARD, "eval", final, "--data", data / "chat"], threads=1,
                            timeout=600).stdout)
    index = json.loads((data / "chat" / "index.json").read_text())
    shards = [data / "chat" / e["file"] for e in index["splits"]["val"]]
    ids, targets = masked_windows(shards, 1 << 30)
    assert 0 < (targets != -100).sum() < targets.size  # prompts are masked, answers are not
    assert report["tokens"] == int((targets != -100).sum())
    run([SWITCHYARD, "convert", "to-hf", final, tmp_path / "hf"], threads=1, timeout=600)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets).reshape(-1),
                                             ignore_index=-100)
    assert report["val_loss"] == pytest.approx(loss.item(), rel=2e-5)
    # The training curve's figure is the same one.
    assert [m["val_loss"] for m in metrics(tmp_path / "run") if "val_loss" in m][-1] == \
        pytest.approx(report["val_loss"], rel=1e-6)


def test_a_masked_step_has_the_same_loss_on_one_and_two_ranks(data, tmp_path):
    chat_run(tmp_path / "one", data)
    chat_run(tmp_path / "two", data, ranks=2)
    one = [m for m in metrics(tmp_path / "one") if "cross_entropy" in m]
    two = [m for m in metrics(tmp_path / "two") if "cross_entropy" in m]
    assert [m["step"] for m in one] == [1, 2]
    for a, b in zip(one, two):
        assert b["cross_entropy"] == pytest.approx(a["cross_entropy"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)


def blend_recipe(path, data, chat_weight=1.0):
    """recipes/tiny-blend.textproto (docs/data.md's walkthrough) on this test's prepared sets: the
    plays as a dataset prepared with the chat set's tokenizer."""
    text, plays = re.subn(r'name: "plays" corpus: "[^"]*"',
                          'name: "plays" dataset: "%s"' % (data / "corpus"), BLEND.read_text())
    text, chat = re.subn(r'name: "chat"( +)dataset: "[^"]*" weight: 1 ',
                         r'name: "chat"\1dataset: "%s" weight: %g ' % (data / "chat", chat_weight),
                         text)
    assert plays == chat == 1, "recipes/tiny-blend.textproto no longer has the walkthrough's sources"
    path.write_text(text)
    return path


def test_a_blend_reports_each_source_and_resumes_under_another_layout(data, tmp_path):
    recipe = blend_recipe(tmp_path / "blend.textproto", data)
    described = run([SWITCHYARD, "inspect", recipe], threads=1, timeout=600).stdout
    assert "plays: weight 3, 75.0% of each batch" in described
    assert "chat: weight 1, 25.0% of each batch" in described
    steps = ["--set", "train.steps=6", "--set", "train.eval_interval=3",
             "--set", "checkpoint.interval_steps=3"]
    whole = tmp_path / "whole"
    run([SWITCHYARD, "train", recipe, "--run-dir", whole, *SMALL, *steps], threads=1,
        timeout=600)
    logged = [m for m in metrics(whole) if "tokens_by_source" in m]
    last = logged[-1]
    assert last["step"] == 6
    assert sum(last["tokens_by_source"].values()) == 6 * 4 * SEQ
    assert set(last["tokens_by_source"]) == {"plays", "chat"}
    evals = [m for m in metrics(whole) if "val_loss" in m]
    for m in evals:
        by_source = m["val_loss_by_source"]
        assert m["val_loss"] == pytest.approx(0.75 * by_source["plays"] + 0.25 * by_source["chat"])
    # Stopped at step 3 (its checkpoint) and resumed on 2 data-parallel ranks.
    part = tmp_path / "part"
    run([SWITCHYARD, "train", recipe, "--run-dir", part, *SMALL, *steps,
         "--resume-from", whole / "checkpoints" / "step_3"], ranks=2, threads=1, timeout=600)
    resumed = {m["step"]: m for m in metrics(part) if "tokens_by_source" in m}
    for m in logged:
        if m["step"] > 3:
            assert resumed[m["step"]]["tokens_by_source"] == m["tokens_by_source"]
            assert resumed[m["step"]]["loss"] == pytest.approx(m["loss"], rel=1e-4)
    # Changing the blend is refused on resume.
    changed = blend_recipe(tmp_path / "changed.textproto", data, chat_weight=2.0)
    result = run([SWITCHYARD, "train", changed, "--run-dir", whole, *SMALL, *steps], expect=None,
                 threads=1, timeout=600)
    assert result.returncode == 1 and "data.sources" in result.stderr
