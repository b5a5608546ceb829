"""Hostile and damaged inputs of the safetensors, final-weights and Hugging Face readers
and of `convert`'s output directory (see hostile.py for the harness)."""
import json
import math
import os
import struct

from hostile import Case
from sy_testing import REPO

NAN_TENSOR = "model.norm.weight"
EXPERTS = "model.layers.0.mlp.experts.gate_up_proj"


def _read_safetensors(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def _write_safetensors(path, header, data, length=None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


def _sample(weights):
    return ["sample", str(weights), "--prompt", "ROMEO:", "--tokens", "1"]


def _damaged_header(edit):
    """A sample of weights whose model.safetensors header went through edit(header)."""
    def make(world, tmp):
        weights = world.weights(tmp)
        path = weights / "model.safetensors"
        header, data = _read_safetensors(path)
        edit(header)
        _write_safetensors(path, header, data)
        return _sample(weights)
    return make


def _tensor(name):
    def edit_of(change):
        def edit(header):
            change(header[name])
        return edit
    return edit_of


_norm = _tensor(NAN_TENSOR)


def _set(key, value):
    def change(entry):
        entry[key] = value
    return change


def _overlap(header):
    tensors = sorted((k for k in header if k != "__metadata__"),
                     key=lambda k: header[k]["data_offsets"][0])
    first, second = tensors[0], tensors[1]
    begin = header[first]["data_offsets"][0] + 4
    size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    header[second]["data_offsets"] = [begin, begin + size]


def _truncated(world, tmp):
    weights = world.weights(tmp)
    path = weights / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2])
    return _sample(weights)


def _header_length(length, file_bytes=None):
    def make(world, tmp):
        weights = world.weights(tmp)
        path = weights / "model.safetensors"
        raw = path.read_bytes()
        path.write_bytes(struct.pack("<Q", length) + raw[8:])
        if file_bytes:
            with open(path, "r+b") as f:
                f.truncate(file_bytes)
        return _sample(weights)
    return make


def _header_not_json(world, tmp):
    weights = world.weights(tmp)
    path = weights / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[8:24] = b"\x00garbage{{{[[[\x01"
    path.write_bytes(bytes(raw))
    return _sample(weights)


def _poke(path, name, index, value):
    """Writes the f32 `value` at element `index` of tensor `name` of a safetensors file."""
    header, _ = _read_safetensors(path)
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    with open(path, "r+b") as f:
        f.seek(8 + length + header[name]["data_offsets"][0] + 4 * index)
        f.write(struct.pack("<f", value))


def _poisoned(value, argv):
    def make(world, tmp):
        weights = world.weights(tmp)
        _poke(weights / "model.safetensors", NAN_TENSOR, 17, value)
        return argv(world, tmp, weights)
    return make


def _small_recipe_vocab(world, tmp):
    weights = world.weights(tmp)
    recipe = weights / "recipe.textproto"
    recipe.write_text(recipe.read_text().replace("vocab_size: 1024", "vocab_size: 512", 1))
    return _sample(weights)


def _from_hf(hf, tmp):
    return ["convert", "from-hf", str(hf), str(tmp / "imported")]


def _config(edit):
    """An import of a Hugging Face directory whose config.json went through edit(config)."""
    def make(world, tmp):
        hf = world.hf(tmp)
        config = json.loads((hf / "config.json").read_text())
        edit(config)
        (hf / "config.json").write_text(json.dumps(config))
        return _from_hf(hf, tmp)
    return make


def _config_set(key, value):
    def edit(config):
        config[key] = value
    return edit


def _config_delete(key):
    def edit(config):
        del config[key]
    return edit


def _deepseek_config(key, value):
    """An import of a directory whose config.json is DeepSeek-V3's (the hf_config fuzz
    target's seed) with config[key] = value: refused before any weight is read."""
    def make(world, tmp):
        hf = world.hf(tmp)
        config = json.loads((REPO / "tests/fuzz/corpus/hf_config/deepseek_v3.json").read_text())
        config[key] = value
        (hf / "config.json").write_text(json.dumps(config))
        return _from_hf(hf, tmp)
    return make


def _yarn(key="rope_parameters", **fields):
    """An import of DeepSeek-V3's config.json (as _deepseek_config) whose `key` object is
    YaRN's, factor 4 over an original context of 32, with `fields` changed."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32, **fields}
    return _deepseek_config(key, rope)


def _yarn_text(old, new):
    """As _yarn(), with `old` replaced by `new` in config.json's text (a number json.dumps
    cannot write)."""
    make_yarn = _yarn()

    def make(world, tmp):
        argv = make_yarn(world, tmp)
        config = tmp / "hf" / "config.json"
        config.write_text(config.read_text().replace(old, new, 1))
        return argv
    return make


def _sharded(shard_name, prepare=None):
    """An import whose model.safetensors.index.json names every tensor's shard
    `shard_name`; prepare(hf, tmp) makes that name's file."""
    def make(world, tmp):
        hf = world.hf(tmp)
        header, _ = _read_safetensors(hf / "model.safetensors")
        if prepare:
            prepare(hf, tmp)
        (hf / "model.safetensors").unlink()
        weight_map = {name: shard_name for name in header if name != "__metadata__"}
        (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return _from_hf(hf, tmp)
    return make


def _outside_link(hf, tmp):
    outside = tmp / "outside"
    outside.mkdir()
    (hf / "model.safetensors").rename(outside / "model.safetensors")
    (hf / "model.safetensors").write_bytes(b"")
    os.symlink(outside / "model.safetensors", hf / "shard.safetensors")


def _fifo_shard(hf, tmp):
    os.mkfifo(hf / "shard.safetensors")


def _tokenizer_outside(world, tmp):
    hf = world.hf(tmp)
    outside = tmp / "outside"
    outside.mkdir()
    (hf / "tokenizer.model").rename(outside / "tokenizer.model")
    os.symlink(outside / "tokenizer.model", hf / "tokenizer.model")
    return _from_hf(hf, tmp)


def _hf_nan(world, tmp):
    hf = world.hf(tmp)
    _poke(hf / "model.safetensors", NAN_TENSOR, 17, math.nan)
    return _from_hf(hf, tmp)


def _flattened_experts(world, tmp):
    weights = world.weights(tmp)
    path = weights / "model.safetensors"
    header, data = _read_safetensors(path)
    entry = header[EXPERTS]
    entry["shape"] = [math.prod(entry["shape"])]
    _write_safetensors(path, header, data)
    return ["convert", "to-hf", str(weights), str(tmp / "out")]


def _into_own_input(world, tmp):
    weights = world.weights(tmp)
    return ["convert", "to-hf", str(weights), str(weights / "hf")]


def _into_symlink_to_input(world, tmp):
    weights = world.weights(tmp)
    os.symlink(weights, tmp / "out")
    return ["convert", "to-hf", str(weights), str(tmp / "out")]


def _from_hf_into_input(world, tmp):
    hf = world.hf(tmp)
    return ["convert", "from-hf", str(hf), str(hf)]


def _into_non_empty(world, tmp):
    return ["convert", "to-hf", str(world.weights(tmp)), str(world.hf(tmp))]


CASES = [
    Case("safetensors-truncated", "safetensors", "cut to half its length", _truncated,
         "(file truncated?)"),
    Case("safetensors-header-length-2-63", "safetensors", "header length 2^63",
         _header_length(1 << 63), "is over the cap of 104857600 bytes"),
    Case("safetensors-header-over-cap", "safetensors",
         "header length 101 MB in a 110 MB (sparse) file",
         _header_length(101 << 20, 110 << 20), "is over the cap of 104857600 bytes"),
    Case("safetensors-header-past-end", "safetensors", "header length 50 MB in a smaller file",
         _header_length(50 << 20), "runs past the end of the file"),
    Case("safetensors-header-not-json", "safetensors", "header bytes overwritten with garbage",
         _header_not_json, "header: not a JSON object"),
    Case("safetensors-shape-string", "safetensors", "a shape written as a string",
         _damaged_header(_norm(_set("shape", "[128]"))),
         "field model.norm.weight.shape must be an array of non-negative integers"),
    Case("safetensors-dtype-unknown", "safetensors", "dtype \"F64\"",
         _damaged_header(_norm(_set("dtype", "F64"))),
         "field model.norm.weight.dtype \"F64\" is not one of"),
    Case("safetensors-negative-dim", "safetensors", "shape [-128]",
         _damaged_header(_norm(_set("shape", [-128]))),
         "field model.norm.weight.shape must be an array of non-negative integers"),
    Case("safetensors-size-overflow", "safetensors", "shape [2^32, 2^32] (byte size overflows int64)",
         _damaged_header(_norm(_set("shape", [1 << 32, 1 << 32]))), "whose byte size overflows"),
    Case("safetensors-offsets-beyond", "safetensors", "data_offsets ending 1 TB past the data",
         _damaged_header(_norm(_set("data_offsets", [0, 1 << 40]))),
         "field model.norm.weight.data_offsets [0, 1099511627776] lies outside"),
    Case("safetensors-overlap", "safetensors", "two tensors' byte ranges overlapping",
         _damaged_header(_overlap), "overlap in the data"),
    Case("safetensors-metadata-not-string", "safetensors", "__metadata__ {\"format\": 1}",
         _damaged_header(lambda h: h.update({"__metadata__": {"format": 1}})),
         "field __metadata__.format must be a string"),
    Case("weights-nan-sample", "final weights", "a NaN weight, then sample",
         _poisoned(math.nan, lambda w, t, weights: _sample(weights)),
         f"tensor {NAN_TENSOR} holds NaN at element 17"),
    Case("weights-inf-eval", "final weights", "an infinite weight, then eval",
         _poisoned(math.inf, lambda w, t, weights: ["eval", str(weights), "--data",
                                                    str(w.dataset(t))]),
         f"tensor {NAN_TENSOR} holds infinity at element 17"),
    Case("weights-nan-convert", "final weights", "a NaN weight, then convert to-hf",
         _poisoned(math.nan, lambda w, t, weights: ["convert", "to-hf", str(weights),
                                                    str(t / "out")]),
         f"tensor {NAN_TENSOR} holds NaN at element 17"),
    Case("weights-wrong-shape-convert", "final weights",
         "the experts' [E, 2I, H] tensor stored flat (same bytes), then convert to-hf",
         _flattened_experts, f"tensor {EXPERTS} is f32[524288], expected f32[8, 512, 128]"),
    Case("weights-tokenizer-too-big", "final weights",
         "recipe.textproto's model.vocab_size 512 under a 1024-piece tokenizer.model",
         _small_recipe_vocab, "1024 pieces do not fit the model's model.vocab_size of 512"),
    Case("hf-config-wrong-type", "HF config.json", "hidden_size \"128\" (a string)",
         _config(_config_set("hidden_size", "128")), "field hidden_size must be an integer"),
    Case("hf-config-null", "HF config.json", "num_attention_heads null",
         _config(_config_set("num_attention_heads", None)),
         "field num_attention_heads must be an integer"),
    Case("hf-config-missing", "HF config.json",
         "vocab_size deleted: Mixtral's default 32000 is more than the safetensors hold",
         _config(_config_delete("vocab_size")), "more than its safetensors files'"),
    Case("hf-config-model-type-number", "HF config.json", "model_type 7",
         _config(_config_set("model_type", 7)), "field model_type must be a string"),
    Case("hf-config-layers-1e9", "HF config.json", "num_hidden_layers 10^9",
         _config(_config_set("num_hidden_layers", 10**9)), "model.num_layers (1000000000)"),
    Case("hf-config-vocab-2-40", "HF config.json", "vocab_size 2^40",
         _config(_config_set("vocab_size", 1 << 40)),
         "field vocab_size must be an integer in [1, 16777216]"),
    Case("hf-config-model-beyond-files", "HF config.json",
         "intermediate_size 262144: a model of at least 3.2 GB in 7.7 MB of safetensors",
         _config(_config_set("intermediate_size", 262144)), "more than its safetensors files'"),
    Case("hf-deepseek-kv-rank-2-40", "HF config.json", "DeepSeek-V3's kv_lora_rank 2^40",
         _deepseek_config("kv_lora_rank", 1 << 40),
         "field kv_lora_rank must be an integer in [1, 2147483647]"),
    Case("hf-deepseek-kv-rank-0", "HF config.json", "DeepSeek-V3's kv_lora_rank 0",
         _deepseek_config("kv_lora_rank", 0),
         "field kv_lora_rank must be an integer in [1, 2147483647]"),
    Case("hf-deepseek-q-rank-negative", "HF config.json", "DeepSeek-V3's q_lora_rank -1",
         _deepseek_config("q_lora_rank", -1),
         "field q_lora_rank must be an integer in [1, 2147483647]"),
    Case("hf-deepseek-rope-odd", "HF config.json", "DeepSeek-V3's qk_rope_head_dim 5",
         _deepseek_config("qk_rope_head_dim", 5), "model.mla.qk_rope_head_dim (5) must be even"),
    Case("hf-deepseek-kv-rank-huge", "HF config.json", "DeepSeek-V3's kv_lora_rank 10^6",
         _deepseek_config("kv_lora_rank", 10**6), "model.mla.kv_lora_rank (1000000)"),
    Case("hf-deepseek-groups-0", "HF config.json", "DeepSeek-V3's n_group 0",
         _deepseek_config("n_group", 0), "field n_group must be an integer in [1, 8]"),
    Case("hf-deepseek-top-groups-beyond", "HF config.json",
         "DeepSeek-V3's topk_group 3 of n_group 2",
         _deepseek_config("topk_group", 3), "field topk_group must be an integer in [1, 2]"),
    Case("hf-deepseek-dense-beyond", "HF config.json",
         "DeepSeek-V3's first_k_dense_replace 10^9 (3 layers)",
         _deepseek_config("first_k_dense_replace", 10**9),
         "field first_k_dense_replace must be an integer in [0, 3]"),
    Case("hf-deepseek-interleave-string", "HF config.json", "DeepSeek-V3's rope_interleave \"yes\"",
         _deepseek_config("rope_interleave", "yes"), "field rope_interleave must be true or false"),
    Case("hf-deepseek-kv-heads", "HF config.json",
         "DeepSeek-V3's num_key_value_heads 2 of 4 heads",
         _deepseek_config("num_key_value_heads", 2),
         "model.num_kv_heads (2) must equal model.num_heads with latent attention"),
    Case("hf-deepseek-topk-method", "HF config.json", "DeepSeek-V3's topk_method \"greedy\"",
         _deepseek_config("topk_method", "greedy"), "topk_method \"greedy\""),
    Case("hf-yarn-factor-negative", "HF config.json", "DeepSeek-V3's YaRN factor -4",
         _yarn(factor=-4.0), "field rope_parameters.factor must be a finite number in [0, 65536]"),
    Case("hf-yarn-factor-zero", "HF config.json", "DeepSeek-V3's YaRN factor 0",
         _yarn(factor=0.0), "model.rope_scaling.factor (0) must be > 0 and finite"),
    Case("hf-yarn-factor-below-one", "HF config.json", "DeepSeek-V3's YaRN factor 0.5",
         _yarn(factor=0.5), "model.rope_scaling.factor (0.5) must be >= 1"),
    Case("hf-yarn-factor-nan", "HF config.json", "DeepSeek-V3's YaRN factor NaN",
         _yarn(factor=math.nan), "config.json"),
    Case("hf-yarn-factor-huge", "HF config.json", "DeepSeek-V3's YaRN factor 1e30",
         _yarn(factor=1e30), "field rope_parameters.factor must be a finite number in [0, 65536]"),
    Case("hf-yarn-factor-overflow", "HF config.json", "DeepSeek-V3's YaRN factor 1e999",
         _yarn_text('"factor": 4.0', '"factor": 1e999'), "config.json"),
    Case("hf-yarn-factor-string", "HF config.json", "DeepSeek-V3's YaRN factor \"4\"",
         _yarn(factor="4"), "field rope_parameters.factor must be a finite number"),
    Case("hf-yarn-factor-missing", "HF config.json", "DeepSeek-V3's YaRN factor null",
         _yarn(factor=None), "rope_parameters.factor"),
    Case("hf-yarn-legacy-factor-negative", "HF config.json",
         "DeepSeek-V3's 4.x rope_scaling {\"type\": \"yarn\", \"factor\": -4}",
         _yarn("rope_scaling", rope_type=None, type="yarn", factor=-4.0),
         "field rope_scaling.factor must be a finite number in [0, 65536]"),
    Case("hf-yarn-original-zero", "HF config.json",
         "DeepSeek-V3's YaRN original_max_position_embeddings 0",
         _yarn(original_max_position_embeddings=0),
         "field rope_parameters.original_max_position_embeddings must be an integer in "
         "[1, 2147483647]"),
    Case("hf-yarn-original-2-40", "HF config.json",
         "DeepSeek-V3's YaRN original_max_position_embeddings 2^40",
         _yarn(original_max_position_embeddings=1 << 40),
         "field rope_parameters.original_max_position_embeddings must be an integer in "
         "[1, 2147483647]"),
    Case("hf-yarn-original-huge", "HF config.json",
         "DeepSeek-V3's YaRN original_max_position_embeddings 2^31 - 1",
         _yarn(original_max_position_embeddings=(1 << 31) - 1),
         "model.rope_scaling.original_max_position_embeddings (2147483647) must be <= 16777216"),
    Case("hf-yarn-original-float", "HF config.json",
         "DeepSeek-V3's YaRN original_max_position_embeddings 4096.5",
         _yarn(original_max_position_embeddings=4096.5),
         "field rope_parameters.original_max_position_embeddings must be an integer"),
    Case("hf-rope-parameters-list", "HF config.json", "DeepSeek-V3's rope_parameters [4, 32]",
         _deepseek_config("rope_parameters", [4, 32]), "field rope_parameters must be an object"),
    Case("hf-rope-type-number", "HF config.json", "DeepSeek-V3's rope_parameters.rope_type 5",
         _yarn(rope_type=5), "rope_parameters.rope_type"),
    Case("hf-rope-type-unknown", "HF config.json",
         "DeepSeek-V3's rope_parameters.rope_type \"dynamic\"", _yarn(rope_type="dynamic"),
         "rope_parameters.rope_type"),
    Case("hf-yarn-not-deepseek", "HF config.json", "Mixtral's rope_scaling YaRN", _config(_config_set("rope_scaling", {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 32})),
         "rope_scaling.rope_type"),
    Case("hf-index-dotdot", "HF model.safetensors.index.json", "every shard named \"../x.safetensors\"",
         _sharded("../x.safetensors"), "is not a plain file name inside"),
    Case("hf-index-absolute", "HF model.safetensors.index.json", "every shard named \"/etc/passwd\"",
         _sharded("/etc/passwd"), "is not a plain file name inside"),
    Case("hf-index-symlink-out", "HF model.safetensors.index.json",
         "the shard a symlink to a file outside the directory",
         _sharded("shard.safetensors", _outside_link), "leads outside"),
    Case("hf-index-fifo", "HF model.safetensors.index.json", "the shard a FIFO",
         _sharded("shard.safetensors", _fifo_shard), "is not a regular file"),
    Case("hf-index-not-string", "HF model.safetensors.index.json", "a weight_map value 5",
         _sharded(5), "must be a file name"),
    Case("hf-tokenizer-symlink-out", "HF tokenizer.model",
         "a symlink to a tokenizer outside the directory", _tokenizer_outside, "leads outside"),
    Case("hf-nan-import", "HF safetensors", "a NaN weight, then convert from-hf", _hf_nan,
         f"tensor {NAN_TENSOR} holds NaN at element 17"),
    Case("convert-into-own-input", "convert output directory", "OUT inside the weights directory",
         _into_own_input, "lies inside the input"),
    Case("convert-into-symlink-to-input", "convert output directory",
         "OUT a symlink to the weights directory", _into_symlink_to_input,
         "is the input"),
    Case("convert-from-hf-into-input", "convert output directory", "from-hf with OUT = HF_DIR",
         _from_hf_into_input, "is the input"),
    Case("convert-non-empty-output", "convert output directory",
         "to-hf into an earlier export without --overwrite", _into_non_empty,
         "the output directory is not empty"),
]
