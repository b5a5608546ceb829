"""Hostile parts of a `data prepare` (part records, their shards) and a resume with other
arguments (see hostile.py for the harness)."""
import json

from hostile import Case
from sy_testing import CORPUS, SWITCHYARD, run


def _prepare_parts(world, tmp, parts=(0, 1), shard_tokens=(20000, 20000)):
    """Prepares the given parts of 2 (two slices of the corpus) into tmp/out with the
    world's tokenizer, part i with shard_tokens[i]; returns the directory."""
    dataset = world.dataset(tmp)
    text = CORPUS.read_text()
    inputs = []
    for k in range(2):
        inputs.append(tmp / f"in{k}.txt")
        inputs[-1].write_text(text[k * 100000:(k + 1) * 100000])
    out = tmp / "out"
    for i in parts:
        run([SWITCHYARD, "data", "prepare", "--tokenizer", dataset / "tokenizer.model",
             "--input", *inputs, "--out", out, "--shard-tokens", shard_tokens[i],
             "--part", f"{i}/2"], timeout=None)
    return out


def _merge(damage=lambda out: None, **kwargs):
    def make(world, tmp):
        out = _prepare_parts(world, tmp, **kwargs)
        damage(out)
        return ["data", "merge-parts", str(out)]
    return make


def _copy_record(out):
    (out / "part-00001-of-00002.json").write_bytes((out / "part-00000-of-00002.json").read_bytes())


def _swap_shards(out):
    a = out / ".part-00000-of-00002.train-00000.h5"
    b = out / ".part-00001-of-00002.train-00000.h5"
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def _edit_record(out):
    path = out / "part-00001-of-00002.json"
    record = json.loads(path.read_text())
    record["arguments"]["val_fraction"] = 0.5
    path.write_text(json.dumps(record))


def _resume_other(world, tmp):
    """A finished part 0 of 1 (as a prepare killed before its merge leaves it), then the
    prepare run again with another --shard-tokens."""
    dataset = world.dataset(tmp)
    text = tmp / "in.txt"
    text.write_text(CORPUS.read_text()[:100000])
    args = ["data", "prepare", "--tokenizer", str(dataset / "tokenizer.model"), "--input",
            str(text), "--out", str(tmp / "out")]
    run([SWITCHYARD, *args, "--part", "0/1"], timeout=None)
    return args + ["--shard-tokens", "5000"]


CASES = [
    Case("prepare-part-missing", "prepare part records", "part 1 of 2 never prepared",
         _merge(parts=(0,)), "part-00001-of-00002.json: missing: part 1/2 has not run"),
    Case("prepare-part-foreign", "prepare part records",
         "part 1 of 2 prepared with another --shard-tokens", _merge(shard_tokens=(20000, 30000)),
         "made with other arguments, tokenizer, template or inputs"),
    Case("prepare-part-record-copied", "prepare part records",
         "part 0's record copied over part 1's", _merge(_copy_record),
         "is the record of part 0/2, not of part 1/2"),
    Case("prepare-part-shards-swapped", "prepare part records",
         "the first train shards of parts 0 and 1 swapped", _merge(_swap_shards),
         "not the shard its part record lists"),
    Case("prepare-part-record-edited", "prepare part records",
         "a record's val_fraction edited (its fingerprint kept)", _merge(_edit_record),
         "is not the sha256 of the arguments (the record was edited)"),
    Case("prepare-resume-other-arguments", "prepare part records",
         "a prepare run again over its record with another --shard-tokens", _resume_other,
         "a prepare made with other arguments"),
]
