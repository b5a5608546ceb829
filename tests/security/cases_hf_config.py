"""Numbers of a Hugging Face config.json (see hostile.py for the harness). A field the file
leaves out is transformers' default for the model type, and a refusal of it says so; a
field it sets must have the JSON type and range the engine needs: an explicit 0 is refused
where a size must be positive, never read as "the default"; null only where transformers
gives null a meaning (num_key_value_heads, head_dim, DeepSeek-V3's q_lora_rank)."""
from cases_hf import _config, _config_delete, _config_set, _deepseek_config, _yarn
from cases_upcycle import _upcycle
from hostile import Case

POSITIVE = "must be a finite number in (0, 3.40282e+38]"
INT32 = "must be an integer in [1, 2147483647]"


def _both(*edits):
    def edit(config):
        for one in edits:
            one(config)
    return edit


def _mistral_default_window(config):
    config.update(model_type="mistral", architectures=["MistralForCausalLM"])
    config.pop("sliding_window", None)


CASES = [
    Case("hf-config-head-dim-zero", "HF config.json", "head_dim 0",
         _config(_config_set("head_dim", 0)), f"field head_dim {INT32}"),
    Case("hf-config-kv-heads-zero", "HF config.json", "num_key_value_heads 0",
         _config(_config_set("num_key_value_heads", 0)),
         "field num_key_value_heads must be an integer in [1, 4]"),
    Case("hf-config-kv-heads-default", "HF config.json",
         "num_key_value_heads deleted: Mixtral's default is 8, more than the 4 heads",
         _config(_config_delete("num_key_value_heads")),
         "field num_key_value_heads must be an integer in [1, 4] (absent: transformers' "
         "default 8)"),
    Case("hf-config-eps-zero", "HF config.json", "rms_norm_eps 0",
         _config(_config_set("rms_norm_eps", 0)), f"field rms_norm_eps {POSITIVE}"),
    Case("hf-config-eps-null", "HF config.json", "rms_norm_eps null",
         _config(_config_set("rms_norm_eps", None)), f"field rms_norm_eps {POSITIVE}"),
    Case("hf-config-rope-theta-zero", "HF config.json", "rope_theta 0",
         _config(_config_set("rope_theta", 0)), f"field rope_theta {POSITIVE}"),
    Case("hf-config-rope-theta-negative", "HF config.json", "rope_parameters.rope_theta -1",
         _config(_config_set("rope_parameters", {"rope_type": "default", "rope_theta": -1})),
         f"field rope_parameters.rope_theta {POSITIVE}"),
    Case("hf-config-init-range-zero", "HF config.json", "initializer_range 0",
         _config(_config_set("initializer_range", 0)), f"field initializer_range {POSITIVE}"),
    Case("hf-config-positions-zero", "HF config.json", "max_position_embeddings 0",
         _config(_config_set("max_position_embeddings", 0)),
         f"field max_position_embeddings {INT32}"),
    Case("hf-config-ffn-float", "HF config.json", "intermediate_size 256.0 (not an integer)",
         _config(_config_set("intermediate_size", 256.0)), f"field intermediate_size {INT32}"),
    Case("hf-config-experts-bool", "HF config.json", "num_local_experts true",
         _config(_config_set("num_local_experts", True)), f"field num_local_experts {INT32}"),
    Case("hf-config-top-k-zero", "HF config.json", "num_experts_per_tok 0",
         _config(_config_set("num_experts_per_tok", 0)),
         "field num_experts_per_tok must be an integer in [1, 8]"),
    Case("hf-config-aux-negative", "HF config.json", "router_aux_loss_coef -0.01",
         _config(_config_set("router_aux_loss_coef", -0.01)),
         "field router_aux_loss_coef must be a finite number in [0, 3.40282e+38]"),
    Case("hf-config-tie-number", "HF config.json", "tie_word_embeddings 0",
         _config(_config_set("tie_word_embeddings", 0)),
         "field tie_word_embeddings must be true or false"),
    Case("hf-deepseek-q-rank-zero", "HF config.json", "DeepSeek-V3's q_lora_rank 0",
         _deepseek_config("q_lora_rank", 0), f"field q_lora_rank {INT32}"),
    Case("hf-deepseek-scaling-zero", "HF config.json", "DeepSeek-V3's routed_scaling_factor 0",
         _deepseek_config("routed_scaling_factor", 0), f"field routed_scaling_factor {POSITIVE}"),
    Case("hf-deepseek-shared-negative", "HF config.json", "DeepSeek-V3's n_shared_experts -1",
         _deepseek_config("n_shared_experts", -1),
         "field n_shared_experts must be an integer in [0, 2147483647]"),
    Case("hf-deepseek-top-groups-default", "HF config.json",
         "DeepSeek-V3's topk_group null: a wrong type, not transformers' default 4",
         _deepseek_config("topk_group", None), "field topk_group must be an integer in [1, 2]"),
    Case("hf-yarn-beta-fast-zero", "HF config.json", "DeepSeek-V3's YaRN beta_fast 0",
         _yarn(beta_fast=0), "field rope_parameters.beta_fast must be a finite number in "
         "(0, 65536]"),
    Case("hf-yarn-mscale-negative", "HF config.json", "DeepSeek-V3's YaRN mscale -1",
         _yarn(mscale=-1.0), "field rope_parameters.mscale must be a finite number in "
         "(0, 65536]"),
    Case("upcycle-mistral-default-window", "HF config.json (dense)",
         "Mistral without sliding_window (transformers' default 4096)",
         _upcycle("--experts", "4", "--top-k", "2", edit=_mistral_default_window),
         "sliding_window is absent, which transformers reads as 4096"),
]
