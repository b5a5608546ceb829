"""Hostile instruction data (JSON Lines conversations, chat templates, loss masks in
shards) and blends (see hostile.py for the harness)."""
import json
import os

import numpy as np

from hostile import Case, h5py_file
from sy_testing import REPO, TINY_RECIPE
from cases_data import _first_train_shard, _reindex, _train_on

MISTRAL = REPO / "data" / "templates" / "mistral.json"
GOOD_RECORD = '{"prompt": "Who is there?", "response": "Nay, answer me."}'


def _prepare(records=GOOD_RECORD, template=None):
    """`data prepare --chat-template` on `records` (text of the JSON Lines file) with the
    world's tokenizer; `template` makes the template file from tmp, else the shipped one."""
    def make(world, tmp):
        dataset = world.dataset(tmp)
        chats = tmp / "chats.jsonl"
        chats.write_text(records(tmp) if callable(records) else records)
        chat_template = template(tmp) if template else MISTRAL
        return ["data", "prepare", "--tokenizer", str(dataset / "tokenizer.model"),
                "--input", str(chats), "--out", str(tmp / "out"), "--val-fraction", "0",
                "--chat-template", str(chat_template)]
    return make


def _template_text(text):
    def make(tmp):
        path = tmp / "template.json"
        path.write_text(text)
        return path
    return make


def _template_fifo(tmp):
    path = tmp / "template.json"
    os.mkfifo(path)
    return path


def _template_oversized(tmp):
    path = tmp / "template.json"
    with open(path, "wb") as f:
        f.truncate(200 << 20)
    return path


def _deep(depth):
    return "[" * depth + "]" * depth


def _shard_mask(mask_of):
    """Train on the world's dataset after giving its first train shard a /loss_mask
    (mask_of(tokens) gives its contents), the index updated to match."""
    def make(world, tmp):
        dataset = world.dataset(tmp)
        shard = _first_train_shard(dataset)
        with h5py_file(shard, "a") as f:
            f.create_dataset("loss_mask", data=mask_of(f["tokens"].shape[0]))
        _reindex(dataset, shard)
        return _train_on(world, tmp, dataset)
    return make


def _blend(sources):
    """Train a recipe whose data is a blend of `sources` (text of the sources entries,
    given the world's dataset directory)."""
    def make(world, tmp):
        dataset = world.dataset(tmp)
        text = TINY_RECIPE.read_text().replace('corpus: "../data/corpus/tinyshakespeare.txt"',
                                                sources(dataset, tmp))
        recipe = tmp / "blend.textproto"
        recipe.write_text(text)
        return world.train_args(recipe, tmp / "run")
    return make


def _other_tokenizer_dataset(dataset, tmp):
    other = tmp / "other"
    other.mkdir()
    index = json.loads((dataset / "index.json").read_text())
    index["tokenizer_sha256"] = "0" * 64
    index.pop("tokenizer_file", None)
    for split in index["splits"].values():
        for entry in split:
            (other / entry["file"]).write_bytes((dataset / entry["file"]).read_bytes())
    (other / "index.json").write_text(json.dumps(index))
    return other


CASES = [
    Case("chat-record-not-object", "instruction JSON Lines", "a record that is a JSON array",
         _prepare(GOOD_RECORD + "\n[1, 2]\n"), "chats.jsonl:2: not a JSON object"),
    Case("chat-record-deep-nesting", "instruction JSON Lines",
         "a record nested 100,000 levels deep (a recursive parser's stack)",
         _prepare('{"messages": ' + _deep(100000) + "}\n"), "nests deeper than 16 levels"),
    Case("chat-record-role-not-string", "instruction JSON Lines", "a message whose role is a number",
         _prepare('{"messages": [{"role": 1, "content": "x"}]}\n'),
         "chats.jsonl:1: message 0: no string field \"role\""),
    Case("chat-record-unknown-role", "instruction JSON Lines",
         "a role the template does not have", _prepare(
             '{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}\n'),
         "role \"tool\" is not in chat template mistral"),
    Case("chat-record-nothing-trained", "instruction JSON Lines",
         "a conversation without an answer (nothing would carry loss)",
         _prepare('{"messages": [{"role": "user", "content": "x"}]}\n'),
         "no message of a role that carries loss"),
    Case("chat-template-unknown-field", "chat template", "a misspelt field (\"los\")",
         _prepare(template=_template_text(
             '{"format": "switchyard-chat-template", "roles": {"assistant": {"los": true}}}')),
         "roles.assistant has an unknown field \"los\""),
    Case("chat-template-deep-nesting", "chat template", "nested 10,000 levels deep",
         _prepare(template=_template_text('{"roles": ' + _deep(10000) + "}")),
         "nests deeper than 16 levels"),
    Case("chat-template-long-string", "chat template", "a 10 kB prefix",
         _prepare(template=_template_text(json.dumps({
             "format": "switchyard-chat-template",
             "roles": {"assistant": {"prefix": "x" * 10000, "loss": True}}}))),
         "is longer than 4096 bytes"),
    Case("chat-template-fifo", "chat template", "a FIFO (would block a reader)",
         _prepare(template=_template_fifo), "is not a regular file"),
    Case("chat-template-oversized", "chat template", "a 200 MB sparse file",
         _prepare(template=_template_oversized), "allowed"),
    Case("shard-loss-mask-length", "dataset shard", "a /loss_mask one entry short",
         _shard_mask(lambda n: np.ones(n - 1, dtype=np.uint8)), "not one per token"),
    Case("shard-loss-mask-type", "dataset shard", "a /loss_mask of int32",
         _shard_mask(lambda n: np.ones(n, dtype=np.int32)), "/loss_mask must be uint8"),
    Case("shard-loss-mask-value", "dataset shard", "a /loss_mask entry 2",
         _shard_mask(lambda n: np.minimum(np.arange(n) % 3, 2).astype(np.uint8)),
         "is 2, not 0 or 1"),
    Case("blend-source-name", "recipe data.sources", "a source named \"../x\"",
         _blend(lambda d, t: f'sources {{ name: "../x" dataset: "{d}" weight: 1 }}'),
         "data.sources[0].name must be 1 to 64 letters"),
    Case("blend-weight-nan", "recipe data.sources", "a weight of nan",
         _blend(lambda d, t: f'sources {{ name: "a" dataset: "{d}" weight: nan }}'),
         "data.sources[0].weight (nan) must be positive and finite"),
    Case("blend-other-tokenizer", "recipe data.sources",
         "a second source made with another tokenizer",
         _blend(lambda d, t: f'sources {{ name: "a" dataset: "{d}" weight: 1 }} '
                             f'sources {{ name: "b" dataset: "{_other_tokenizer_dataset(d, t)}" '
                             f'weight: 1 }}'),
         "tokenizer"),
]
