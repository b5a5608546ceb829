"""`switchyard sample` against transformers' `generate`: a small random Mixtral, Qwen2-MoE
and DeepSeek-V3 (latent attention, whose cache holds the latent, under YaRN) saved by
transformers and imported with `convert from-hf` continue a prompt
greedily with the same 200 token ids as `model.generate(do_sample=False)`, with the
key/value cache and without it (`--no-kv-cache`); top-k, top-p, the seed and stop strings
and the stop at end-of-sequence do what the docs say.

Run by ctest with the interop environment's Python; SWITCHYARD names the binary.
"""
import json

import pytest
import torch

from sy_testing import SWITCHYARD, run

VOCAB = 320
NEW_TOKENS = 200
PROMPT = "ROMEO:\nI will not stay"


@pytest.fixture(scope="module")
def tokenizer(corpus_tokenizer):
    return corpus_tokenizer(VOCAB, 40000)


def hf_model(kind):
    torch.manual_seed(5)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.2,
                  num_hidden_layers=2)
    if kind == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=6, **common))
    elif kind == "deepseek_v3_yarn":
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
        model = DeepseekV3ForCausalLM(DeepseekV3Config(
            n_routed_experts=8, moe_intermediate_size=48, n_shared_experts=1, n_group=2,
            topk_group=1, first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16,
            qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=16,
            rope_scaling={"rope_type": "yarn", "factor": 4.0,
                          "original_max_position_embeddings": 64, "beta_fast": 32.0,
                          "beta_slow": 1.0, "mscale": 0.7, "mscale_all_dim": 1.0},
            **{**common, "num_key_value_heads": 4}))
    else:
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
            num_experts=4, moe_intermediate_size=48, shared_expert_intermediate_size=80,
            decoder_sparse_step=1, norm_topk_prob=False, **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return model.float().eval()


def hf_greedy(model, prompt_ids):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), do_sample=False,
                             max_new_tokens=NEW_TOKENS)
    return out[0, len(prompt_ids):].tolist()


def imported(model, tokenizer, root):
    model.save_pretrained(root / "hf")
    (root / "hf" / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    run([SWITCHYARD, "convert", "from-hf", root / "hf", root / "weights"], threads=1)
    return root / "weights"


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "deepseek_v3_yarn"])
def test_greedy_sample_equals_generate(tmp_path, tokenizer, kind):
    model = hf_model(kind)
    weights = imported(model, tokenizer, tmp_path)
    sample = [SWITCHYARD, "sample", weights, "--prompt", PROMPT, "--temperature", "0",
              "--ignore-eos", "--tokens", NEW_TOKENS, "--ids"]
    cached = json.loads(run(sample, threads=1).stdout)
    assert len(cached["generated_ids"]) == NEW_TOKENS
    expected = hf_greedy(model, cached["prompt_ids"])
    assert cached["generated_ids"] == expected
    assert len(set(expected)) > 20, "a greedy loop on one token would hide a wrong cache"
    assert json.loads(run([*sample, "--no-kv-cache"], threads=1).stdout) == cached


def test_sampling_options(tmp_path, tokenizer):
    weights = imported(hf_model("mixtral"), tokenizer, tmp_path)

    def sample(*flags):
        return run([SWITCHYARD, "sample", weights, "--prompt", PROMPT, "--tokens", 40,
                    "--ignore-eos", *flags], threads=1)

    def ids(*flags):
        result = sample("--ids", *flags)
        return json.loads(result.stdout)["generated_ids"], result.stderr

    greedy, quiet = ids("--temperature", "0")
    assert quiet == ""
    # One candidate left by top-k or top-p: the most likely token at any temperature.
    assert ids("--temperature", "2", "--top-k", "1", "--seed", "1")[0] == greedy
    assert ids("--temperature", "2", "--top-p", "1e-6", "--seed", "1")[0] == greedy
    # A seed repeats a sample; without one, the random seed printed repeats it.
    drawn, _ = ids("--temperature", "2", "--seed", "7")
    assert drawn != greedy and ids("--temperature", "2", "--seed", "7")[0] == drawn
    unseeded, line = ids("--temperature", "2")
    seed = line.split()[3]
    assert line == f"switchyard sample: seed {seed} (--seed {seed} repeats this sample)\n"
    assert ids("--temperature", "2", "--seed", seed)[0] == unseeded
    # A stop string ends the text before it. A random model prints stray bytes, so the
    # text is compared as bytes and the stop is two ASCII letters from its middle.
    command = [SWITCHYARD, "sample", weights, "--prompt", PROMPT, "--tokens", "40",
               "--ignore-eos", "--temperature", "0"]
    text = run(command, threads=1, timeout=None, text=False).stdout
    at = next(i for i in range(len(PROMPT) + 10, len(text) - 1) if text[i:i + 2].isalpha())
    stop = text[at:at + 2]
    stopped = run([*command, "--stop", stop], threads=1, timeout=None, text=False).stdout
    assert stopped == text[:text.index(stop, len(PROMPT))] + b"\n"


def test_stops_at_eos(tmp_path, tokenizer):
    """The weights are edited so that the first greedy token is eos: `sample` stops before
    it, and goes on past it with --ignore-eos."""
    model = hf_model("mixtral")
    eos = 2  # data/tokenizer.h kTrainedSpecialIds

    def sample(weights, *flags):
        result = run([SWITCHYARD, "sample", weights, "--prompt", PROMPT, "--temperature", "0",
                      "--tokens", "5", "--ids", *flags], threads=1)
        return json.loads(result.stdout)

    prompt = sample(imported(model, tokenizer, tmp_path / "plain"))["prompt_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
        first = int(logits.argmax())
        assert first != eos and logits[first] > 0
        model.lm_head.weight[eos] = 2 * model.lm_head.weight[first]
    weights = imported(model, tokenizer, tmp_path / "eos")
    assert sample(weights)["generated_ids"] == []
    assert sample(weights, "--ignore-eos")["generated_ids"][0] == eos
