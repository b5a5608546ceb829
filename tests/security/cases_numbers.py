"""Hostile numbers on the command line: every flag and `--set` value is read by one parser
(core/runtime/numbers.h), so each spelling is refused the same way everywhere, in one
line naming the flag, before anything is written (see hostile.py for the harness)."""
from hostile import Case
from sy_testing import TINY_RECIPE


def _sample(*flags):
    def make(world, tmp):
        return ["sample", str(world.weights(tmp)), "--prompt", "ROMEO:", *flags]
    return make


def _set(assignment):
    def make(world, tmp):
        return world.train_args(TINY_RECIPE, tmp / "run", "--set", assignment)
    return make


def _plan(*flags):
    def make(world, tmp):
        return ["plan", str(TINY_RECIPE), "--world", "2", "--device-memory", "80GiB", *flags]
    return make


def _eval(*flags):
    def make(world, tmp):
        return ["eval", str(world.weights(tmp)), "--data", str(world.dataset(tmp)), *flags]
    return make


def _prepare(*flags):
    def make(world, tmp):
        dataset = world.dataset(tmp)
        text = tmp / "text.txt"
        text.write_text("some text\n\nmore text\n")
        return ["data", "prepare", "--tokenizer", str(dataset / "tokenizer.model"),
                "--input", str(text), "--out", str(tmp / "out"), *flags]
    return make


def _tokenizer(*flags):
    def make(world, tmp):
        text = tmp / "text.txt"
        text.write_text("some text\n")
        return ["data", "tokenizer", "--input", str(text), "--out", str(tmp / "t.model"), *flags]
    return make


def _balance(*flags, synthetic="zipf:1.1"):
    def make(world, tmp):
        return ["bench", "balance", str(world.weights(tmp)), "--synthetic", synthetic,
                "--json", str(tmp / "b.json"), *flags]
    return make


def _convert(*flags):
    def make(world, tmp):
        return ["convert", "to-hf", str(world.weights(tmp)), str(tmp / "hf"), *flags]
    return make


def _upcycle(*flags):
    def make(world, tmp):
        return ["convert", "upcycle", str(world.hf(tmp)), str(tmp / "moe"), "--experts", "4",
                "--top-k", "2", *flags]
    return make


def _case(id, input, damage, make, expect):
    return Case(id, input, damage, make, expect, writes_nothing=True)


CASES = [
    _case("number-sample-seed-negative", "number on the command line", "sample --seed -1",
          _sample("--seed", "-1"), "--seed: -1 must be a non-negative integer"),
    _case("number-sample-tokens-int64-max", "number on the command line",
          "sample --tokens 9223372036854775807 (the prompt and it overflow)",
          _sample("--tokens", "9223372036854775807"),
          "--tokens: 9223372036854775807 is out of range [1, 16777216]"),
    _case("number-sample-tokens-beyond-64-bits", "number on the command line",
          "sample --tokens 99999999999999999999", _sample("--tokens", "99999999999999999999"),
          "--tokens: 99999999999999999999 is out of range [1, 16777216]"),
    _case("number-sample-top-k-hex", "number on the command line", "sample --top-k 0x10",
          _sample("--top-k", "0x10"), "--top-k: 0x10 is not an integer"),
    _case("number-sample-temperature-infinite", "number on the command line",
          "sample --temperature inf", _sample("--temperature", "inf"),
          "--temperature: inf is not a finite number"),
    _case("number-set-seed-negative", "number on the command line", "--set train.seed=-1",
          _set("train.seed=-1"), "train.seed: -1 must be a non-negative integer"),
    _case("number-set-steps-tokens-overflow", "number on the command line",
          "--set train.steps=2^62: the run's tokens, steps x batch x seq_len, overflow 64 bits",
          _set(f"train.steps={1 << 62}"),
          f"train.steps x train.global_batch_size x train.seq_len: {1 << 62} x 4 x 32 is out "
          "of range [0, 9223372036854775807]"),
    _case("number-set-steps-exponent", "number on the command line", "--set train.steps=1e3",
          _set("train.steps=1e3"), "train.steps: 1e3 is not an integer"),
    _case("number-set-steps-hex", "number on the command line", "--set train.steps=0x10",
          _set("train.steps=0x10"), "train.steps: 0x10 is not an integer"),
    _case("number-set-steps-plus", "number on the command line", "--set train.steps=+5",
          _set("train.steps=+5"), "train.steps: +5 is not an integer"),
    _case("number-set-steps-space", "number on the command line", "--set 'train.steps= 5'",
          _set("train.steps= 5"), 'train.steps: " 5" is not an integer'),
    _case("number-set-lr-trailing-junk", "number on the command line",
          "--set optimizer.lr=1e-3x", _set("optimizer.lr=1e-3x"),
          "optimizer.lr: 1e-3x is not a number"),
    _case("number-set-lr-overflow", "number on the command line", "--set optimizer.lr=1e999",
          _set("optimizer.lr=1e999"), "optimizer.lr: 1e999 is out of range"),
    _case("number-plan-memory-half-byte", "number on the command line",
          "plan --device-memory 0.5B", _plan("--device-memory", "0.5B"),
          "--device-memory: 0.5B is below one byte"),
    _case("number-plan-world-beyond-64-bits", "number on the command line",
          "plan --world 99999999999999999999", _plan("--world", "99999999999999999999"),
          "--world: 99999999999999999999 is out of range [1, 4096]"),
    _case("number-plan-layout-huge", "number on the command line",
          "plan --layout tp=99999999999", _plan("--layout", "tp=99999999999"),
          "--layout tp: 99999999999 is out of range [1, 4096]"),
    _case("number-eval-windows-huge", "number on the command line",
          "eval --windows 99999999999999999999 (windows x seq_len overflow)",
          _eval("--windows", "99999999999999999999"),
          "--windows: 99999999999999999999 is out of range [0, 68719476736]"),
    _case("number-prepare-part-beyond", "number on the command line", "data prepare --part 3/2",
          _prepare("--part", "3/2"), "--part I: 3 is out of range [0, 1]"),
    _case("number-prepare-part-zero", "number on the command line", "data prepare --part 0/0",
          _prepare("--part", "0/0"), "--part N: 0 is out of range [1, 99999]"),
    _case("number-prepare-shard-tokens-zero", "number on the command line",
          "data prepare --shard-tokens 0", _prepare("--shard-tokens", "0"),
          "--shard-tokens: 0 is out of range [1, 1099511627776]"),
    _case("number-prepare-val-fraction-one", "number on the command line",
          "data prepare --val-fraction 1", _prepare("--val-fraction", "1"),
          "--val-fraction: 1 is out of range [0, 1)"),
    _case("number-prepare-threads-negative", "number on the command line",
          "data prepare --threads -1", _prepare("--threads", "-1"),
          "--threads: -1 must be a non-negative integer"),
    _case("number-tokenizer-vocab-huge", "number on the command line",
          "data tokenizer --vocab-size 99999999999", _tokenizer("--vocab-size", "99999999999"),
          "--vocab-size: 99999999999 is out of range [300, 16777216]"),
    _case("number-balance-ep-huge", "number on the command line",
          "bench balance --ep 99999999999", _balance("--ep", "99999999999"),
          "--ep: 99999999999 is out of range [1, 4096]"),
    _case("number-balance-batches-tokens", "number on the command line",
          "bench balance --batches 2^28: batches x micro-batch x seq_len beyond 2^28 tokens",
          _balance("--batches", str(1 << 28)),
          f"--batches x train.micro_batch_size x train.seq_len: {1 << 28} x 4 x 32 is out of "
          f"range [1, {1 << 28}]"),
    _case("number-balance-zipf-nan", "number on the command line",
          "bench balance --synthetic zipf:nan", _balance(synthetic="zipf:nan"),
          "--synthetic zipf:S: nan is not a finite number"),
    _case("number-convert-shard-size-below-a-byte", "number on the command line",
          "convert to-hf --max-shard-size 0.5B", _convert("--max-shard-size", "0.5B"),
          "--max-shard-size: 0.5B is below one byte"),
    _case("number-upcycle-seed-negative", "number on the command line",
          "convert upcycle --seed -1", _upcycle("--seed", "-1"),
          "--seed: -1 must be a non-negative integer"),
]
