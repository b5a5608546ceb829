"""Padding instead of packing (data.packing PAD) on instruction data: each conversation is
one window, padded. The engine's evaluation equals the mean cross-entropy transformers
gives on the Hugging Face export over the same padded windows built from the shard with
h5py (no loss on prompts or padding), and a run resumed from its step-2 checkpoint ends
bit for bit where the uninterrupted run does.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

SEQ = 96
SMALL = ["--set", "model.num_layers=2", "--set", f"train.seq_len={SEQ}",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1",
         "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2",
         "--set", "train.steps=4", "--set", "train.eval_interval=4",
         "--set", "checkpoint.interval_steps=2", "--set", "data.packing=PAD"]


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def chat(chat_dataset):
    """Pairs of consecutive speeches as prompt and answer, prepared with the Mistral
    template: some conversations fit a window, some are longer."""
    return chat_dataset(300)


def train(run_dir, chat, *extra):
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, *SMALL,
                "--set", "data.corpus=", "--set", f"data.dataset={chat}", *extra], threads=1,
               timeout=600)


def padded_windows(shard_paths, pad_id):
    """One window per document: ids padded with pad_id, targets -100 where the loss mask
    is 0 and on the padding; a longer document cut to SEQ + 1 tokens."""
    ids, targets = [], []
    for path in shard_paths:
        with h5py.File(path, "r") as f:
            tokens, mask = f["tokens"][:].astype(np.int64), f["loss_mask"][:]
            offsets = f["doc_offsets"][:]
        for first, end in zip(offsets[:-1], offsets[1:]):
            count = min(end - first, SEQ + 1)
            window_ids = np.full(SEQ, pad_id)
            window_targets = np.full(SEQ, -100)
            window_ids[:min(count, SEQ)] = tokens[first:first + min(count, SEQ)]
            doc_targets = tokens[first + 1:first + count]
            window_targets[:count - 1] = np.where(mask[first + 1:first + count] == 1,
                                                   doc_targets, -100)
            ids.append(window_ids)
            targets.append(window_targets)
    return np.stack(ids), np.stack(targets)


def test_padded_evaluation_equals_transformers(chat, tmp_path):
    train(tmp_path / "run", chat)
    final = tmp_path / "run" / "checkpoints" / "final"
    report = json.loads(run([SWITCHYARD, "eval", final, "--data", chat, "--windows", "64"],
                            threads=1, timeout=600).stdout)
    index = json.loads((chat / "index.json").read_text())
    shards = [chat / e["file"] for e in index["splits"]["val"]]
    special = index["special_ids"]
    ids, targets = padded_windows(shards, special["pad"] if special["pad"] >= 0 else special["eos"])
    ids, targets = ids[:64], targets[:64]
    lengths = (targets != -100).sum(axis=1)
    assert lengths.min() < lengths.max()  # windows of several lengths, padded
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


def test_a_padded_run_resumes_bit_for_bit(chat, tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    train(whole, chat)
    resumed = train(part, chat, "--resume-from", whole / "checkpoints" / "step_2")
    assert "resuming from" in resumed.stdout + resumed.stderr
    steps = {m["step"]: m for m in metrics(whole) if "loss" in m}
    again = [m for m in metrics(part) if "loss" in m]
    assert [m["step"] for m in again] == [3, 4]  # it started after the checkpoint
    for m in again:
        assert m["loss"] == steps[m["step"]]["loss"]
        assert m["grad_norm"] == steps[m["step"]]["grad_norm"]
