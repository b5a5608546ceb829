"""Hostile and damaged recipes and command-line values (see hostile.py for the harness)."""
import os

from hostile import Case
from sy_testing import SWITCHYARD, TINY_RECIPE, run


def _recipe_copy(tmp, text=None):
    path = tmp / "r.textproto"
    path.write_text(TINY_RECIPE.read_text() if text is None else text)
    return path


def _fifo_recipe(world, tmp):
    path = tmp / "fifo.textproto"
    os.mkfifo(path)
    return world.train_args(path, tmp / "run")


def _directory_recipe(world, tmp):
    return world.train_args(tmp, tmp / "run")


def _huge_recipe(world, tmp):
    path = tmp / "huge.textproto"
    with open(path, "wb") as f:
        f.truncate(200 << 20)
    return world.train_args(path, tmp / "run")


def _binary_recipe(world, tmp):
    path = tmp / "binary.textproto"
    path.write_bytes(bytes(range(256)) * 8)
    return world.train_args(path, tmp / "run")


def _deep_recipe(world, tmp):
    path = _recipe_copy(tmp, "model " + "{ " * 100000 + "}" * 100000)
    return world.train_args(path, tmp / "run")


def _override(assignment, extra=()):
    def make(world, tmp):
        return world.train_args(TINY_RECIPE, tmp / "run", "--set", assignment, *extra)
    return make


CASES = [
    Case("recipe-fifo", "recipe", "a FIFO instead of a file (would block a reader)",
         _fifo_recipe, "is not a regular file"),
    Case("recipe-directory", "recipe", "a directory", _directory_recipe, "is a directory"),
    Case("recipe-oversized", "recipe", "a 200 MB sparse file", _huge_recipe, "allowed"),
    Case("recipe-binary", "recipe", "binary bytes", _binary_recipe, "binary.textproto"),
    Case("recipe-deep-nesting", "recipe", "100000 nested messages", _deep_recipe, "r.textproto"),
    Case("set-int-overflow", "--set value", "train.steps=99999999999999999999",
         _override("train.steps=99999999999999999999"), "train.steps"),
    Case("set-negative-size", "--set value", "model.hidden_size=-128",
         _override("model.hidden_size=-128"), "model.hidden_size"),
    Case("set-nan-lr", "--set value", "optimizer.lr=nan", _override("optimizer.lr=nan"),
         "optimizer.lr"),
    Case("set-huge-vocab", "--set value", "model.vocab_size=2000000000 (about 1 TB of weights)",
         _override("model.vocab_size=2000000000"), "model.vocab_size"),
    Case("set-nan-router-lr-scale", "--set value", "optimizer.router_lr_scale=nan",
         _override("optimizer.router_lr_scale=nan"), "optimizer.router_lr_scale"),
    Case("set-huge-router-lr-scale", "--set value", "optimizer.router_lr_scale=1e30",
         _override("optimizer.router_lr_scale=1e30"), "optimizer.router_lr_scale"),
    Case("set-huge-model", "--set value",
         "model.hidden_size=65536, 64 heads, 64 layers: memory the machine does not have",
         _override("model.hidden_size=65536",
                   ("--set", "model.num_heads=64", "--set", "model.num_layers=64")), "GiB"),
    Case("set-mla-negative-rank", "--set value", "model.mla.kv_lora_rank=-1",
         _override("model.mla.kv_lora_rank=-1"), "model.mla.kv_lora_rank (-1) must be >= 0"),
    Case("set-mla-odd-rope", "--set value",
         "model.mla.qk_rope_head_dim=3 with a latent of 32 (and 4 key/value heads)",
         _override("model.mla.kv_lora_rank=32",
                   ("--set", "model.num_kv_heads=4", "--set", "model.mla.qk_nope_head_dim=16",
                    "--set", "model.mla.qk_rope_head_dim=3", "--set", "model.mla.v_head_dim=16")),
         "model.mla.qk_rope_head_dim (3) must be even"),
    Case("set-mla-without-latent", "--set value", "model.mla.q_lora_rank=64 with no kv_lora_rank",
         _override("model.mla.q_lora_rank=64"), "model.mla needs kv_lora_rank > 0"),
    Case("set-placement-not-an-expert", "--set value",
         "parallel.expert_placement=0,1,2,3,4,5,6,2147483647 (8 experts, ep 2)",
         _override("parallel.expert_placement=0,1,2,3,4,5,6,2147483647",
                   ("--set", "parallel.expert_parallel_size=2")),
         "parallel.expert_placement[7] (2147483647) is not an expert"),
    Case("set-placement-repeated-expert", "--set value",
         "parallel.expert_placement=0,1,2,3,4,5,6,6 (8 experts, ep 2)",
         _override("parallel.expert_placement=0,1,2,3,4,5,6,6",
                   ("--set", "parallel.expert_parallel_size=2")),
         "parallel.expert_placement[7] (6) lists an expert twice"),
    Case("set-placement-overflow", "--set value",
         "parallel.expert_placement=99999999999 (past int32)",
         _override("parallel.expert_placement=99999999999"),
         "parallel.expert_placement[0]: 99999999999 is out of range [-2147483648, 2147483647]"),
]


def _bench_foreign_dataset(world, tmp):
    import json
    dataset = world.dataset(tmp)
    index = json.loads((dataset / "index.json").read_text())
    index["tokenizer_sha256"] = "0" * 64
    (dataset / "index.json").write_text(json.dumps(index))
    return ["bench", "balance", str(world.weights(tmp)), "--data", str(dataset)]


CASES.append(Case("bench-foreign-dataset", "dataset for `bench balance`",
                  "tokenised with another tokenizer than the weights'", _bench_foreign_dataset,
                  "tokenizer"))


def _init_from(damage):
    def make(world, tmp):
        weights = world.weights(tmp)
        dataset = world.dataset(tmp)
        extra = damage(weights, dataset) or ()
        return world.train_args(TINY_RECIPE, tmp / "run", "--init-from", str(weights),
                                "--set", "data.corpus=", "--set", f"data.dataset={dataset}",
                                *extra)
    return make


def _foreign_dataset(weights, dataset):
    import json
    index = json.loads((dataset / "index.json").read_text())
    index["tokenizer_sha256"] = "0" * 64
    (dataset / "index.json").write_text(json.dumps(index))


def _nan_weight(weights, dataset):
    import struct
    path = weights / "model.safetensors"
    data = bytearray(path.read_bytes())
    header = struct.unpack("<Q", data[:8])[0]
    data[8 + header:8 + header + 4] = struct.pack("<f", float("nan"))
    path.write_bytes(bytes(data))


def _other_shape(weights, dataset):
    return ("--set", "model.num_layers=3")


CASES += [
    Case("init-from-foreign-dataset", "dataset for `train --init-from`",
         "tokenised with another tokenizer than the weights'", _init_from(_foreign_dataset),
         "tokenizer sha256"),
    Case("init-from-nan-weight", "weights for `train --init-from`", "a NaN in the first tensor",
         _init_from(_nan_weight), "NaN"),
    Case("init-from-other-model", "recipe for `train --init-from`",
         "model.num_layers 3 where the weights have 2", _init_from(_other_shape),
         "model.num_layers is 3 in the recipe but 2"),
    Case("init-from-missing", "`train --init-from`", "a directory that does not exist",
         lambda world, tmp: world.train_args(TINY_RECIPE, tmp / "run", "--init-from",
                                             str(tmp / "nowhere")),
         "not a weights directory"),
]


def _train_imported_without_data(world, tmp):
    run([SWITCHYARD, "convert", "from-hf", world.hf(tmp), tmp / "imported"], timeout=None)
    return ["train", str(tmp / "imported" / "recipe.textproto"), "--run-dir", str(tmp / "run")]


CASES.append(Case("train-imported-placeholder", "recipe written by `convert from-hf`",
                  "trained as written, its placeholder data unset", _train_imported_without_data,
                  "data.dataset is the placeholder"))


def _yarn(field, value):
    """The tiny recipe with YaRN rope scaling (factor 4 over an original context of 32),
    then --set model.rope_scaling.<field>=<value>."""
    def make(world, tmp):
        return world.train_args(TINY_RECIPE, tmp / "run",
                                "--set", "model.rope_scaling.type=YARN",
                                "--set", "model.rope_scaling.factor=4",
                                "--set", "model.rope_scaling.original_max_position_embeddings=32",
                                "--set", f"model.rope_scaling.{field}={value}")
    return make


def _rope_type_number(world, tmp):
    text = TINY_RECIPE.read_text().replace(
        "model {", "model {\n  rope_scaling { type: 7 factor: 4 original_max_position_embeddings: 32 }",
        1)
    return world.train_args(_recipe_copy(tmp, text), tmp / "run")


CASES += [
    Case("set-yarn-factor-negative", "--set value", "model.rope_scaling.factor=-4 under YaRN",
         _yarn("factor", "-4"), "model.rope_scaling.factor (-4) must be >= 0 and finite"),
    Case("set-yarn-factor-zero", "--set value", "model.rope_scaling.factor=0 under YaRN",
         _yarn("factor", "0"), "model.rope_scaling.factor (0) must be > 0 and finite"),
    Case("set-yarn-factor-tiny", "--set value",
         "model.rope_scaling.factor=1e-40 under YaRN (its inverse frequencies overflow)",
         _yarn("factor", "1e-40"), "must be >= 1: YaRN extends the original context by it"),
    Case("set-yarn-factor-nan", "--set value", "model.rope_scaling.factor=nan under YaRN",
         _yarn("factor", "nan"), "model.rope_scaling.factor: nan is not a finite number"),
    Case("set-yarn-factor-huge", "--set value", "model.rope_scaling.factor=1e30 under YaRN",
         _yarn("factor", "1e30"), "model.rope_scaling.factor (1e+30) must be <= 65536"),
    Case("set-yarn-factor-not-a-number", "--set value", "model.rope_scaling.factor=four",
         _yarn("factor", "four"), "model.rope_scaling.factor"),
    Case("set-yarn-mscale-infinite", "--set value", "model.rope_scaling.mscale=inf under YaRN",
         _yarn("mscale", "inf"), "model.rope_scaling.mscale: inf is not a finite number"),
    Case("set-yarn-original-zero", "--set value",
         "model.rope_scaling.original_max_position_embeddings=0 under YaRN",
         _yarn("original_max_position_embeddings", "0"),
         "model.rope_scaling.original_max_position_embeddings (0) must be > 0"),
    Case("set-yarn-original-huge", "--set value",
         "model.rope_scaling.original_max_position_embeddings=2^40 under YaRN",
         _yarn("original_max_position_embeddings", str(1 << 40)),
         "model.rope_scaling.original_max_position_embeddings (1099511627776) must be <= 16777216"),
    Case("set-yarn-original-overflow", "--set value",
         "model.rope_scaling.original_max_position_embeddings=99999999999999999999",
         _yarn("original_max_position_embeddings", "99999999999999999999"),
         "model.rope_scaling.original_max_position_embeddings"),
    Case("set-rope-type-unknown", "--set value", "model.rope_scaling.type=DYNAMIC",
         _override("model.rope_scaling.type=DYNAMIC"), "model.rope_scaling.type"),
    Case("set-rope-factor-without-yarn", "--set value",
         "model.rope_scaling.factor=4 with no rope scaling type",
         _override("model.rope_scaling.factor=4"),
         "model.rope_scaling.factor is set but model.rope_scaling.type is not YARN"),
    Case("recipe-rope-type-number", "recipe", "rope_scaling { type: 7 } (no such type)",
         _rope_type_number, "model.rope_scaling.type (7) is not YARN"),
]
