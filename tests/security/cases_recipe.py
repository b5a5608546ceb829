"""Hostile and damaged recipes and command-line values (see hostile.py for the harness)."""
import os

from hostile import Case, TINY_RECIPE


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
    Case("set-huge-model", "--set value",
         "model.hidden_size=65536, 64 heads, 64 layers: memory the machine does not have",
         _override("model.hidden_size=65536",
                   ("--set", "model.num_heads=64", "--set", "model.num_layers=64")), "GiB"),
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
