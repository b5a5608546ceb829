"""`switchyard convert upcycle` against transformers' dense Llama, Mistral and Qwen2
classes: a transformers model of random weights, saved and upcycled into a mixture of
experts (copies of its FFN, or its FFN cut into finer experts), gives in the engine the
dense model's logits and cross-entropy; Llama's and Mistral's upcycled models exported
with `convert to-hf` load into transformers' Mixtral with no missing or unexpected keys
and give the dense model's logits there too. Training the upcycled model starts at the
dense model's loss. Options and config fields that cannot give that model are refused
with one line naming them, and nothing is written.

Run by ctest with the interop environment's Python under transformers 5.x and 4.x.
SWITCHYARD names the binary and MODEL_IO_TOOL the tool that runs the engine's forward.
"""
import json
import h5py
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, run
from test_family_interop import assert_close, engine_forward_backward, load_hf

VOCAB, BATCH, SEQ = 320, 2, 16  # VOCAB: conftest.py's batch_dataset
# fp32 throughout: the upcycled forward sums the same products in another order.
RTOL = 1e-5
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
              num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128,
              rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.2)

# name: (transformers class, its config class, the family's own settings)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict()),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=None)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(use_sliding_window=False)),
}
# (experts, top_k, granularity): copies of the whole FFN; the FFN cut in 2 halves, 4
# copies of each, 2 copies chosen per token; cut in 4, each expert chosen.
SHAPES = [(4, 2, 1), (8, 4, 2), (4, 4, 4)]


def dense_model(family):
    model_class, config_class, settings = FAMILIES[family]
    torch.manual_seed(7)
    config = getattr(transformers, config_class)(**COMMON, **settings)
    model = getattr(transformers, model_class)(config)
    # Default norms are all ones and biases zero; random ones make each one count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return model.float().eval()


def upcycle(hf_dir, out, experts, top_k, granularity, check=True):
    return run([SWITCHYARD, "convert", "upcycle", hf_dir, out, "--experts", experts,
                "--top-k", top_k, "--granularity", granularity],
               expect=0 if check else None, threads=1, timeout=600)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "e{}k{}g{}".format(*s))
@pytest.mark.parametrize("family", FAMILIES)
def test_upcycled_forward_equals_dense(tmp_path, family, shape):
    experts, top_k, granularity = shape
    model = dense_model(family)
    model.save_pretrained(tmp_path / "hf")
    upcycle(tmp_path / "hf", tmp_path / "moe", experts, top_k, granularity)
    recipe = (tmp_path / "moe/recipe.textproto").read_text()
    assert f"num_experts: {experts}" in recipe and f"top_k: {top_k}" in recipe
    assert f"expert_ffn_hidden_size: {COMMON['intermediate_size'] // granularity}" in recipe

    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        dense = model(input_ids=ids, labels=ids)
    ours = engine_forward_backward(tmp_path / "moe", ids.numpy(), tmp_path)
    assert_close("logits", ours["logits"], dense.logits.reshape(BATCH * SEQ, VOCAB).numpy(), RTOL)
    assert ours["losses"][1] == pytest.approx(dense.loss.item(), rel=RTOL)

    if family == "qwen2":
        # Qwen2's q/k/v biases without shared experts: no transformers MoE class has both.
        return
    run([SWITCHYARD, "convert", "to-hf", tmp_path / "moe", tmp_path / "back"], threads=1,
        timeout=600)
    config = json.loads((tmp_path / "back/config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (experts, top_k)
    mixtral = load_hf(tmp_path / "back")
    with torch.no_grad():
        assert_close("transformers Mixtral logits", mixtral(input_ids=ids).logits.numpy(),
                     dense.logits.numpy(), RTOL)


def test_bf16_checkpoint_upcycles_to_its_f32_values(tmp_path):
    """Published dense checkpoints are bf16: the upcycled model holds their exact f32
    values and gives the logits of the dense model with those weights."""
    dense_model("qwen2").to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    # Loaded again in f32: the cast model's RoPE frequencies were rounded to bf16 too.
    model = load_hf(tmp_path / "hf")
    upcycle(tmp_path / "hf", tmp_path / "moe", 8, 4, 2)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        dense = model(input_ids=ids).logits.reshape(BATCH * SEQ, VOCAB).numpy()
    ours = engine_forward_backward(tmp_path / "moe", ids.numpy(), tmp_path)
    assert_close("logits", ours["logits"], dense, RTOL)


def test_router_rows_repeat_per_slice_and_differ_between_copies(tmp_path):
    dense_model("llama").save_pretrained(tmp_path / "hf")
    upcycle(tmp_path / "hf", tmp_path / "moe", 6, 2, 2)
    weights = load_file(str(tmp_path / "moe/model.safetensors"))
    router = weights["model.layers.1.mlp.gate.weight"]
    assert router.shape == (6, 32)
    assert np.array_equal(router[0::2], router[1::2])
    assert len({row.tobytes() for row in router[0::2]}) == 3
    assert not np.array_equal(router, weights["model.layers.0.mlp.gate.weight"])
    # The same seed gives the same router; another seed another one.
    upcycle(tmp_path / "hf", tmp_path / "again", 6, 2, 2)
    again = load_file(str(tmp_path / "again/model.safetensors"))
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    run([SWITCHYARD, "convert", "upcycle", tmp_path / "hf", tmp_path / "seeded", "--experts", 6,
         "--top-k", 2, "--granularity", 2, "--seed", 9], threads=1, timeout=600)
    seeded = load_file(str(tmp_path / "seeded/model.safetensors"))
    assert not np.array_equal(seeded["model.layers.1.mlp.gate.weight"], router)


def train_windows(dataset, windows):
    """ids and targets of the train split's `windows` windows: one global batch, so the
    first step trains on each window once (as test_finetune_parity.py)."""
    index = json.loads((dataset / "index.json").read_text())
    tokens = []
    for shard in index["splits"]["train"]:
        with h5py.File(dataset / shard["file"], "r") as f:
            tokens.append(f["tokens"][:].astype(np.int64))
    tokens = np.concatenate(tokens)
    seq_len = (len(tokens) - 1) // windows
    w = np.stack([tokens[i * seq_len: i * seq_len + seq_len + 1] for i in range(windows)])
    return w[:, :-1], w[:, 1:]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_training_the_upcycled_model_starts_at_the_dense_loss(tmp_path, batch_dataset, family):
    tokenizer, dataset = batch_dataset
    ids, targets = train_windows(dataset, 4)
    model = dense_model(family)
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf/tokenizer.model").write_bytes(tokenizer.read_bytes())
    upcycle(tmp_path / "hf", tmp_path / "moe", 8, 4, 2)
    run_dir = tmp_path / "run"
    result = run([SWITCHYARD, "train", tmp_path / "moe/recipe.textproto", "--run-dir", run_dir,
                  "--set", f"data.dataset={dataset}", "--set", "train.steps=3",
                  "--set", f"train.seq_len={ids.shape[1]}", "--set", "train.global_batch_size=4",
                  "--set", "train.micro_batch_size=4", "--set", "train.log_interval=1",
                  "--set", "train.eval_interval=0"], threads=1, timeout=600)
    assert "starting from the weights in" in result.stdout
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids)).logits
        dense_ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                     torch.from_numpy(targets).flatten()).item()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert steps[0]["cross_entropy"] == pytest.approx(dense_ce, rel=RTOL)
    assert all(np.isfinite(m["loss"]) for m in steps)


def refused(result, name):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and name in lines[0], result.stderr


@pytest.mark.parametrize("experts,top_k,granularity,name", [
    (6, 2, 4, "--experts"),        # 6 experts are not whole copies of 4 slices
    (8, 2, 4, "--top-k"),          # 2 chosen experts cannot hold all 4 slices
    (10, 5, 5, "--granularity"),   # 48 rows do not split in 5
    (4, 8, 1, "--top-k"),
    (0, 1, 1, "--experts"),
    (1 << 21, 2, 1, "--experts"),
    (8192, 2, 1, "--experts"),     # beyond the recipe's 4096 experts: the flag's own bound
])
def test_options_that_cannot_give_the_dense_model_are_refused(tmp_path, experts, top_k,
                                                              granularity, name):
    dense_model("llama").save_pretrained(tmp_path / "hf")
    refused(upcycle(tmp_path / "hf", tmp_path / "moe", experts, top_k, granularity, check=False),
            name)
    assert not (tmp_path / "moe").exists()


@pytest.mark.parametrize("family,field,value", [
    ("llama", "attention_bias", True),
    ("llama", "mlp_bias", True),
    ("llama", "hidden_act", "gelu"),
    ("llama", "rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
    ("mistral", "sliding_window", 4096),
    ("qwen2", "use_sliding_window", True),
    ("llama", "intermediate_size", -1),
    ("llama", "model_type", "mixtral"),
])
def test_dense_config_fields_the_engine_cannot_honour_are_refused(tmp_path, family, field, value):
    dense_model(family).save_pretrained(tmp_path / "hf")
    config_path = tmp_path / "hf/config.json"
    config = json.loads(config_path.read_text())
    config[field] = value
    config_path.write_text(json.dumps(config))
    refused(upcycle(tmp_path / "hf", tmp_path / "moe", 4, 2, 1, check=False), field)
    assert not (tmp_path / "moe").exists()


def test_dense_directories_are_refused_by_from_hf_and_moe_ones_by_upcycle(tmp_path):
    dense_model("llama").save_pretrained(tmp_path / "hf")
    result = run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "w"],
                 expect=None, threads=1, timeout=600)
    refused(result, "convert upcycle")
    upcycle(tmp_path / "hf", tmp_path / "moe", 4, 2, 1)
    run([SWITCHYARD, "convert", "to-hf", tmp_path / "moe", tmp_path / "mixtral"], threads=1,
        timeout=600)
    refused(upcycle(tmp_path / "mixtral", tmp_path / "again", 4, 2, 1, check=False), "from-hf")
    assert not (tmp_path / "w").exists() and not (tmp_path / "again").exists()
