"""`switchyard convert to-hf` and `convert from-hf` against transformers: an exported run
loads into AutoModelForCausalLM with no missing or unexpected keys and gives the
engine's logits (Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE shapes); its tokenizer gives
the engine tokenizer's ids; transformers-saved Mixtral, OLMoE and Qwen2-MoE models
import and give transformers' logits in the engine.

Run by ctest with the interop environment's Python; SWITCHYARD names the binary and
MODEL_IO_TOOL the tool that runs the engine's forward on given weights.
"""
import json
import os

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from sy_testing import SWITCHYARD, TINY_RECIPE, binary, run

TOOL = binary("MODEL_IO_TOOL")
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak. 1234  x\n"

QWEN_SETS = ["moe.num_shared_experts=1", "moe.shared_expert_ffn_hidden_size=64",
             "moe.shared_expert_gate=true", "moe.renormalize=false", "model.attention_bias=true"]
# Per-head q/k norm, attention narrower than the hidden size, a dense first layer.
QWEN3_SETS = ["model.qk_head_norm=true", "model.head_dim=16", "model.first_dense_layers=1",
              "model.ffn_hidden_size=192"]
VARIANT_SETS = {"mixtral": [], "qwen2_moe": QWEN_SETS, "qwen3_moe": QWEN3_SETS,
                "olmoe": ["model.qk_norm=true"]}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dataset-cache")


def train(tmp, cache, sets=()):
    run_dir = tmp / "run"
    args = [SWITCHYARD, "train", TINY_RECIPE, "--run-dir", run_dir,
            "--set", "train.steps=2", "--set", "optimizer.warmup_steps=1",
            "--set", "train.eval_interval=0", "--set", "model.num_layers=2",
            "--dataset-cache", cache]
    for s in sets:
        args += ["--set", s]
    run(args, timeout=None)
    return run_dir / "checkpoints" / "final"


def batch(vocab, seed=3):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(2, 16), dtype=np.int32)


def engine_logits(weights_dir, ids, tmp):
    save_file({"ids": ids, "targets": ids}, str(tmp / "batch.safetensors"))
    run([TOOL, weights_dir / "recipe.textproto", weights_dir / "model.safetensors",
         tmp / "batch.safetensors", tmp / "out.safetensors"], timeout=None)
    return load_file(str(tmp / "out.safetensors"))["logits"].reshape(ids.shape + (-1,))


def hf_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()


def test_transformers_release_line_is_the_expected_one():
    import transformers
    expected = os.environ.get("EXPECT_TRANSFORMERS_MAJOR")
    if expected:
        assert transformers.__version__.split(".")[0] == expected, transformers.__version__


def load_hf(path, dtype=torch.float32):
    import transformers
    from transformers import AutoModelForCausalLM
    # transformers 4.x names the argument torch_dtype; 5.x renamed it dtype.
    dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                       **{dtype_arg: dtype})
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(kind), f"{kind}: {info[kind]}"
    return model.eval()


def assert_close(ours, ref, tol):
    err = np.abs(np.asarray(ours, np.float64) - np.asarray(ref, np.float64)).max()
    assert err < tol, f"max abs error {err:.3g}"


@pytest.mark.parametrize("variant,architecture", [("mixtral", "MixtralForCausalLM"),
                                                  ("qwen2_moe", "Qwen2MoeForCausalLM"),
                                                  ("qwen3_moe", "Qwen3MoeForCausalLM"),
                                                  ("olmoe", "OlmoeForCausalLM")])
def test_export_loads_and_matches_engine(tmp_path, cache, variant, architecture):
    import transformers
    if not hasattr(transformers, architecture):
        pytest.skip(f"transformers {transformers.__version__} has no {architecture}")
    final = train(tmp_path, cache, VARIANT_SETS[variant])
    out = tmp_path / "hf"
    run([SWITCHYARD, "convert", "to-hf", final, out], timeout=None)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [architecture] and config["model_type"] == variant
    assert config["rms_norm_eps"] == 1e-05 and isinstance(config["rope_theta"], float)
    model = load_hf(out)
    ids = batch(config["vocab_size"])
    assert_close(hf_logits(model, ids), engine_logits(final, ids, tmp_path), 1e-4)

    # The transformers tokenizer gives the engine tokenizer's ids for plain text.
    import sentencepiece
    from transformers import AutoTokenizer
    expected = sentencepiece.SentencePieceProcessor(model_file=str(final / "tokenizer.model")).encode(TEXT)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer(TEXT)["input_ids"] == expected
    assert tokenizer.decode(expected) == TEXT

    # A round trip through from-hf gives the same weights, hence the same logits.
    back = tmp_path / "back"
    run([SWITCHYARD, "convert", "from-hf", out, back], timeout=None)
    assert (back / "tokenizer.model").read_bytes() == (final / "tokenizer.model").read_bytes()
    np.testing.assert_array_equal(engine_logits(back, ids, tmp_path), engine_logits(final, ids, tmp_path))
    run([SWITCHYARD, "sample", back, "--prompt", "First", "--tokens", "4"], timeout=None)


def test_bf16_and_sharded_exports_load(tmp_path, cache):
    final = train(tmp_path, cache)
    ids = batch(1024)
    reference = engine_logits(final, ids, tmp_path)
    run([SWITCHYARD, "convert", "to-hf", final, tmp_path / "bf16", "--dtype", "bf16"], timeout=None)
    assert json.loads((tmp_path / "bf16/config.json").read_text())["torch_dtype"] == "bfloat16"
    # transformers on the bf16 export computes what the engine computes on the same
    # rounded weights (imported back); that the export holds exactly the f32 weights
    # rounded to bf16 is checked against the f32 export below. (The rounded model's
    # logits are not compared with the f32 ones: a small trained model's logits cancel,
    # so their bf16 error has no scale of its own.)
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "bf16", tmp_path / "bf16_back"], timeout=None)
    rounded = engine_logits(tmp_path / "bf16_back", ids, tmp_path)
    assert_close(hf_logits(load_hf(tmp_path / "bf16", torch.float32), ids), rounded, 1e-4)

    run([SWITCHYARD, "convert", "to-hf", final, tmp_path / "sharded", "--max-shard-size", "2MB"],
        timeout=None)
    index = json.loads((tmp_path / "sharded/model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (tmp_path / "sharded/model.safetensors").exists()
    assert_close(hf_logits(load_hf(tmp_path / "sharded"), ids), reference, 1e-4)
    f32_weights = load_hf(tmp_path / "sharded").state_dict()
    bf16_weights = load_hf(tmp_path / "bf16", torch.bfloat16).state_dict()
    assert f32_weights.keys() == bf16_weights.keys()
    for name, value in f32_weights.items():
        assert torch.equal(value.to(torch.bfloat16), bf16_weights[name]), name
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "sharded", tmp_path / "back"], timeout=None)
    np.testing.assert_array_equal(engine_logits(tmp_path / "back", ids, tmp_path), reference)


def test_overwrite_leaves_exactly_the_new_files(tmp_path, cache):
    final = train(tmp_path, cache)
    out = tmp_path / "hf"
    run([SWITCHYARD, "convert", "to-hf", final, out, "--max-shard-size", "2MB"], timeout=None)
    assert len(list(out.glob("model-*-of-*.safetensors"))) >= 3
    (out / "notes.txt").write_text("not an export's file")
    refused = run([SWITCHYARD, "convert", "to-hf", final, out], expect=None, timeout=None)
    assert refused.returncode == 1 and "--overwrite" in refused.stderr, refused.stderr
    run([SWITCHYARD, "convert", "to-hf", final, out, "--overwrite"], timeout=None)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "notes.txt",
        "special_tokens_map.json", "tokenizer.model", "tokenizer_config.json"]

    back = tmp_path / "back"
    run([SWITCHYARD, "convert", "from-hf", out, back], timeout=None)
    (back / "notes.txt").write_text("kept")
    run([SWITCHYARD, "convert", "from-hf", out, back, "--overwrite"], timeout=None)
    assert sorted(p.name for p in back.iterdir()) == [
        "model.safetensors", "notes.txt", "recipe.textproto", "tokenizer.model"]


@pytest.mark.parametrize("sets,reason", [
    (["moe.gating=GSHARD_TOP2"], "GSHARD_TOP2"),
    (["model.qk_norm=true", "model.attention_bias=true"], "model.attention_bias"),
    (["model.qk_norm=true", "model.first_dense_layers=1", "model.ffn_hidden_size=64"], "dense"),
    (["model.qk_head_norm=true", "moe.num_shared_experts=1",
      "moe.shared_expert_ffn_hidden_size=64", "moe.shared_expert_gate=true"],
     "moe.num_shared_experts"),
    (["moe.num_shared_experts=1", "moe.shared_expert_ffn_hidden_size=64",
      "model.attention_bias=true"], "shared_expert_gate"),
    (["model.attention_bias=true"], "model.attention_bias"),
    (["model.rope_scaling.type=YARN", "model.rope_scaling.factor=4",
      "model.rope_scaling.original_max_position_embeddings=16"], "model.rope_scaling")])
def test_inexpressible_models_are_refused(tmp_path, cache, sets, reason):
    final = train(tmp_path, cache, sets)
    result = run([SWITCHYARD, "convert", "to-hf", final, tmp_path / "hf"], expect=None,
                 timeout=None)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], result.stderr
    assert not (tmp_path / "hf").exists()


def tiny_hf_model(kind):
    torch.manual_seed(5)
    common = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2,
                  max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                  initializer_range=0.2)
    if kind == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM
        return MixtralForCausalLM(MixtralConfig(num_local_experts=4, **common))
    if kind == "olmoe":
        from transformers import OlmoeConfig, OlmoeForCausalLM
        model = OlmoeForCausalLM(OlmoeConfig(num_experts=4, **common))
    else:
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
            num_experts=4, moe_intermediate_size=24, shared_expert_intermediate_size=40,
            decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=False, **common))
    # Default-initialised norms are all ones; random ones check that each lands where it belongs.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("kind", ["mixtral", "olmoe", "qwen2_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_import_transformers_model(tmp_path, kind, dtype):
    model = tiny_hf_model(kind)
    if dtype == torch.bfloat16:
        # Round the weights (not the RoPE buffers) once so that both sides compute on
        # the same bf16 values.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    ids = batch(256)
    reference = hf_logits(model, ids)
    model.to(dtype).save_pretrained(tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    assert_close(engine_logits(tmp_path / "weights", ids, tmp_path), reference, 1e-4)


@pytest.mark.parametrize("field,value", [("sliding_window", 16), ("hidden_act", "gelu"),
                                         ("rope_scaling", {"type": "linear", "factor": 2.0})])
def test_import_refuses_what_the_engine_cannot_honour(tmp_path, field, value):
    tiny_hf_model("mixtral").save_pretrained(tmp_path / "hf")
    config_path = tmp_path / "hf/config.json"
    config = json.loads(config_path.read_text())
    config[field] = value
    config_path.write_text(json.dumps(config))
    result = run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"],
                 expect=None, timeout=None)
    assert result.returncode == 1 and field in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "weights").exists()


def test_import_fused_expert_layout(tmp_path):
    """transformers 5.x's in-memory layout (mlp.experts.gate_up_proj [E, 2I, H], gate rows
    first, and mlp.experts.down_proj [E, H, I]) imports like the per-expert one."""
    model = tiny_hf_model("mixtral")
    ids = batch(256)
    reference = hf_logits(model, ids)
    model.save_pretrained(tmp_path / "hf")
    tensors = load_file(str(tmp_path / "hf/model.safetensors"))
    fused = {k.replace(".block_sparse_moe.", ".mlp."): v for k, v in tensors.items()
             if ".experts." not in k}
    for layer in range(2):
        p = f"model.layers.{layer}.block_sparse_moe.experts."
        fused[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([tensors[f"{p}{e}.w1.weight"], tensors[f"{p}{e}.w3.weight"]]) for e in range(4)])
        fused[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack(
            [tensors[f"{p}{e}.w2.weight"] for e in range(4)])
    save_file(fused, str(tmp_path / "hf/model.safetensors"), metadata={"format": "pt"})
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    assert_close(engine_logits(tmp_path / "weights", ids, tmp_path), reference, 1e-4)
