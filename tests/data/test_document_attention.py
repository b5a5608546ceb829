"""Document-aware attention end to end (data.document_attention). The engine's evaluation
of a packed validation split equals the mean cross-entropy transformers gives on the
Hugging Face export over the same windows, read from the shard with h5py, with each
position's place in its document as position_ids and a 4D mask that keeps attention
inside documents; and two training steps give the same losses on one process, on two
data-parallel ranks and on two tensor-parallel ranks. Each with the standard attention
and with latent attention under YaRN (DeepseekV3ForCausalLM on the transformers side).

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from sy_testing import CORPUS, SWITCHYARD, TINY_RECIPE as RECIPE, run

SEQ = 64
SMALL = ["--set", "model.num_layers=2", "--set", f"train.seq_len={SEQ}",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1",
         "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2",
         "--set", "train.steps=2", "--set", "train.eval_interval=2",
         "--set", "train.eval_tokens=2048", "--set", "data.document_attention=true"]

# Latent attention with YaRN and sigmoid routing (DeepSeek-V3's architecture at the tiny
# size), which takes the document starts as the standard attention does.
LATENT_YARN = ["--set", "model.num_kv_heads=4", "--set", "model.mla.q_lora_rank=48",
               "--set", "model.mla.kv_lora_rank=24", "--set", "model.mla.qk_nope_head_dim=16",
               "--set", "model.mla.qk_rope_head_dim=8", "--set", "model.mla.v_head_dim=16",
               "--set", "moe.score_function=SIGMOID", "--set", "moe.aux_loss_coef=0",
               "--set", "model.rope_scaling.type=YARN",
               "--set", "model.rope_scaling.factor=4",
               "--set", "model.rope_scaling.original_max_position_embeddings=16",
               "--set", "model.rope_scaling.mscale=0.7", "--set", "model.rope_scaling.mscale_all_dim=1"]
ARCHITECTURES = {"standard": [], "latent_yarn": LATENT_YARN}


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The first 200 kB of the corpus (speeches of a few dozen tokens: several documents
    per window), prepared with its own tokenizer."""
    root = tmp_path_factory.mktemp("data")
    text = CORPUS.read_text()[:200_000]
    (root / "corpus.txt").write_text(text[:text.rfind("\n\n") + 1])
    run([SWITCHYARD, "data", "tokenizer", "--input", root / "corpus.txt", "--vocab-size", "512",
         "--out", root / "tok.model"], threads=1, timeout=600)
    run([SWITCHYARD, "data", "prepare", "--tokenizer", root / "tok.model",
         "--input", root / "corpus.txt", "--out", root / "ds", "--val-fraction", "0.1"],
        threads=1, timeout=600)
    return root / "ds"


def train(run_dir, dataset, *extra, ranks=1):
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, *SMALL,
                "--set", "data.corpus=", "--set", f"data.dataset={dataset}", *extra], ranks=ranks,
               threads=1, timeout=600)


def windows_with_documents(shard_paths, windows):
    """The first `windows` windows of the split's stream: ids, targets, and each position's
    document start in its window."""
    tokens, starts = [], []
    for path in shard_paths:
        with h5py.File(path, "r") as f:
            first = sum(len(t) for t in tokens)
            tokens.append(f["tokens"][:].astype(np.int64))
            starts.extend(first + f["doc_offsets"][:-1])
    tokens, starts = np.concatenate(tokens), np.asarray(starts)
    windows = min(windows, (len(tokens) - 1) // SEQ)
    ids = np.stack([tokens[w * SEQ:w * SEQ + SEQ] for w in range(windows)])
    targets = np.stack([tokens[w * SEQ + 1:w * SEQ + SEQ + 1] for w in range(windows)])
    positions = np.arange(SEQ)
    doc_starts = np.stack([
        np.maximum(starts[np.searchsorted(starts, w * SEQ + positions, side="right") - 1] - w * SEQ, 0)
        for w in range(windows)])
    return ids, targets, doc_starts


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_evaluation_equals_transformers_with_document_masks(dataset, tmp_path, architecture):
    train(tmp_path / "run", dataset, *ARCHITECTURES[architecture])
    final = tmp_path / "run" / "checkpoints" / "final"
    report = json.loads(run([SWITCHYARD, "eval", final, "--data", dataset], threads=1,
                            timeout=600).stdout)
    index = json.loads((dataset / "index.json").read_text())
    shards = [dataset / e["file"] for e in index["splits"]["val"]]
    ids, targets, doc_starts = windows_with_documents(shards, 2048 // SEQ)
    assert (doc_starts > 0).any()  # windows do hold several documents
    assert report["tokens"] == targets.size
    run([SWITCHYARD, "convert", "to-hf", final, tmp_path / "hf"], threads=1, timeout=600)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                 attn_implementation="eager").float().eval()
    i = np.arange(SEQ)
    allowed = (i[None, :, None] >= i[None, None, :]) & (i[None, None, :] >= doc_starts[:, :, None])
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask[~torch.from_numpy(allowed)] = torch.finfo(torch.float32).min
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids), attention_mask=mask[:, None],
                       position_ids=torch.from_numpy(i[None, :] - doc_starts)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(targets).reshape(-1))
    assert report["val_loss"] == pytest.approx(loss.item(), rel=2e-5)
    # The training curve's figure is the same one.
    assert [m["val_loss"] for m in metrics(tmp_path / "run") if "val_loss" in m][-1] == \
        pytest.approx(report["val_loss"], rel=1e-6)


@pytest.mark.parametrize("layout", [[], ["--set", "parallel.tensor_parallel_size=2"]],
                         ids=["data_parallel", "tensor_parallel"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_two_ranks_train_as_one_process(dataset, tmp_path, layout, architecture):
    train(tmp_path / "one", dataset, *ARCHITECTURES[architecture])
    train(tmp_path / "two", dataset, *layout, *ARCHITECTURES[architecture], ranks=2)
    one = [m for m in metrics(tmp_path / "one") if "cross_entropy" in m]
    two = [m for m in metrics(tmp_path / "two") if "cross_entropy" in m]
    assert [m["step"] for m in one] == [1, 2]
    for a, b in zip(one, two):
        assert b["cross_entropy"] == pytest.approx(a["cross_entropy"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    val = [[m["val_loss"] for m in metrics(d) if "val_loss" in m] for d in (tmp_path / "one",
                                                                              tmp_path / "two")]
    assert val[1] == pytest.approx(val[0], rel=1e-5)
