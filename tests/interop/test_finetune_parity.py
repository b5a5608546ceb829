"""Fine-tuning an imported model starts from transformers' own numbers: a small random
MixtralForCausalLM, Qwen2MoeForCausalLM (shared expert, a dense first layer),
OlmoeForCausalLM (q/k norms) and Qwen3MoeForCausalLM (per-head q/k norms, a dense first
layer; skipped under a transformers without it), saved with save_pretrained and imported by `switchyard
convert from-hf`, train one step of the recipe the import wrote, and the loss the engine
logs for that step (cross-entropy, the load-balancing loss, and their weighted sum)
equals transformers' on the same batch.

The batch is known without reproducing the loader's shuffle: the dataset's train split
holds exactly one global batch of windows and the step reads it in one micro-batch, so
the step trains on every window once, and both losses are means over its tokens.

Run by ctest with the interop environment's Python; SWITCHYARD names the binary.
"""
import json

import h5py
import numpy as np
import pytest
import torch

from sy_testing import SWITCHYARD, run

VOCAB = 320  # conftest.py's batch_dataset
WINDOWS = 4          # the global batch, and the train split's number of windows
AUX_COEF = 0.02      # router_aux_loss_coef, large enough to weigh in the total


def train_tokens(dataset):
    """The train split's token stream: its shards in index order, concatenated."""
    index = json.loads((dataset / "index.json").read_text())
    parts = []
    for shard in index["splits"]["train"]:
        with h5py.File(dataset / shard["file"], "r") as f:
            parts.append(f["tokens"][:].astype(np.int64))
    return np.concatenate(parts)


def windows(tokens, seq_len):
    """ids and targets of every window the loader forms (data/token_dataset.h)."""
    count = (len(tokens) - 1) // seq_len
    w = np.stack([tokens[i * seq_len: i * seq_len + seq_len + 1] for i in range(count)])
    return w[:, :-1], w[:, 1:]


def hf_model(kind):
    torch.manual_seed(11)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=128,
                  rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.1,
                  router_aux_loss_coef=AUX_COEF)
    if kind == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM
        model = MixtralForCausalLM(MixtralConfig(num_hidden_layers=2, num_local_experts=6,
                                                 **common))
    elif kind == "olmoe":
        from transformers import OlmoeConfig, OlmoeForCausalLM
        model = OlmoeForCausalLM(OlmoeConfig(num_hidden_layers=2, num_experts=4, **common))
    elif kind == "qwen3_moe":
        import transformers
        if not hasattr(transformers, "Qwen3MoeForCausalLM"):
            pytest.skip(f"transformers {transformers.__version__} has no Qwen3MoeForCausalLM")
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            num_hidden_layers=2, num_experts=4, moe_intermediate_size=48, head_dim=24,
            mlp_only_layers=[0], norm_topk_prob=True, **common))
    else:
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
            num_hidden_layers=3, num_experts=4, moe_intermediate_size=48,
            shared_expert_intermediate_size=80, decoder_sparse_step=1, mlp_only_layers=[0],
            norm_topk_prob=False, **common))
    # Default norms are all ones and biases zero; random ones make each one count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return model.float().eval()


def hf_losses(model, ids, targets):
    """transformers' cross-entropy (mean over the batch's tokens) and load-balancing loss."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1),
                                               torch.from_numpy(targets).flatten())
    return ce.item(), out.aux_loss.item()


def first_step(run_dir):
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("step") == 1 and "loss" in m:
            return m
    raise AssertionError("no training record for step 1")


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "olmoe", "qwen3_moe"])
def test_first_step_loss_equals_transformers(tmp_path, batch_dataset, kind):
    tokenizer, dataset = batch_dataset
    tokens = train_tokens(dataset)
    seq_len = (len(tokens) - 1) // WINDOWS
    ids, targets = windows(tokens, seq_len)
    assert ids.shape == (WINDOWS, seq_len)

    model = hf_model(kind)
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], threads=1,
        timeout=600)
    run_dir = tmp_path / "run"
    result = run([SWITCHYARD, "train", tmp_path / "weights" / "recipe.textproto",
                  "--run-dir", run_dir, "--set", f"data.dataset={dataset}",
                  "--set", "train.steps=1", "--set", f"train.seq_len={seq_len}",
                  "--set", f"train.global_batch_size={WINDOWS}",
                  "--set", f"train.micro_batch_size={WINDOWS}",
                  "--set", "train.log_interval=1", "--set", "train.eval_interval=0"],
                 threads=1, timeout=600)
    assert "starting from the weights in" in result.stdout

    ce, aux = hf_losses(model, ids, targets)
    logged = first_step(run_dir)
    assert logged["cross_entropy"] == pytest.approx(ce, rel=1e-5)
    assert logged["aux_loss"] == pytest.approx(aux, rel=1e-5)
    assert logged["loss"] == pytest.approx(ce + AUX_COEF * aux, rel=1e-5)
