"""Hostile run directories of `bench balance --run-dir` (engine/train/balance_history.h):
the metrics.jsonl it reads each layer's imbalance from (see hostile.py for the harness).
An unterminated last line is a write cut short and is dropped, so the damaged lines here
are followed by a complete one."""
import os

from hostile import Case

GOOD = '{"step": 2, "loss": 5.0, "layer_imbalance": [1.5, 1.25]}\n'


def _bench(run_dir, world, tmp):
    return ["bench", "balance", str(world.weights(tmp)), "--batches", "1",
            "--run-dir", str(run_dir)]


def _metrics(text):
    """A run directory whose metrics.jsonl is `text`."""
    def make(world, tmp):
        run = tmp / "run"
        run.mkdir()
        (run / "metrics.jsonl").write_text(text)
        return _bench(run, world, tmp)
    return make


def _symlink_out(world, tmp):
    outside = tmp / "elsewhere.jsonl"
    outside.write_text(GOOD)
    run = tmp / "run"
    run.mkdir()
    os.symlink(outside, run / "metrics.jsonl")
    return _bench(run, world, tmp)


def _fifo(world, tmp):
    run = tmp / "run"
    run.mkdir()
    os.mkfifo(run / "metrics.jsonl")
    return _bench(run, world, tmp)


def _huge_file(world, tmp):
    run = tmp / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "wb") as f:
        f.truncate((1 << 30) + 1)  # sparse: one byte over the reader's limit
    return _bench(run, world, tmp)


def _missing_run_dir(world, tmp):
    return _bench(tmp / "no-such-run", world, tmp)


CASES = [
    Case("balance-run-dir-missing", "bench balance --run-dir", "a directory that does not exist",
         _missing_run_dir, "no such directory"),
    Case("balance-run-dir-metrics-symlink-out", "bench balance --run-dir",
         "metrics.jsonl a symbolic link to a file outside the run directory", _symlink_out,
         "metrics.jsonl"),
    Case("balance-run-dir-metrics-fifo", "bench balance --run-dir",
         "metrics.jsonl a named pipe (a read would wait forever)", _fifo, "metrics.jsonl"),
    Case("balance-run-dir-metrics-huge", "bench balance --run-dir",
         "metrics.jsonl of 1 GiB + 1 byte (sparse)", _huge_file, "metrics.jsonl"),
    Case("balance-run-dir-truncated-line", "bench balance --run-dir",
         "a line cut in the middle, followed by a complete one",
         _metrics('{"step": 1, "loss": 5.0, "layer_imbalance": [1.5,\n' + GOOD), "line 1"),
    Case("balance-run-dir-huge-line", "bench balance --run-dir",
         "a line of 100,000 bytes (the limit is 65,536)",
         _metrics('{"step": 1, "pad": "' + "x" * 100_000 + '"}\n' + GOOD), "line 1"),
    Case("balance-run-dir-nan", "bench balance --run-dir", "layer_imbalance holds NaN",
         _metrics('{"step": 1, "layer_imbalance": [NaN, 1.0]}\n' + GOOD), "line 1"),
    Case("balance-run-dir-infinite", "bench balance --run-dir",
         "layer_imbalance holds 1e999 (infinite as a double)",
         _metrics('{"step": 1, "layer_imbalance": [1e999, 1.0]}\n' + GOOD), "line 1"),
    Case("balance-run-dir-negative", "bench balance --run-dir", "layer_imbalance holds -1",
         _metrics('{"step": 1, "layer_imbalance": [-1, 1.0]}\n' + GOOD),
         "line 1 field layer_imbalance must be an array of 1 to 4096 finite numbers >= 0"),
    Case("balance-run-dir-no-step", "bench balance --run-dir",
         "a line with layer_imbalance and no step",
         _metrics('{"layer_imbalance": [1.0, 1.0]}\n' + GOOD),
         "line 1 has layer_imbalance but no integer step"),
    Case("balance-run-dir-layers-differ", "bench balance --run-dir",
         "a line listing 3 layers after one listing 2",
         _metrics(GOOD + '{"step": 3, "layer_imbalance": [1.0, 1.0, 1.0]}\n'),
         "line 2 lists 3 layers in layer_imbalance, the first line 2"),
    Case("balance-run-dir-no-imbalance", "bench balance --run-dir",
         "no line has layer_imbalance (a dense run's metrics)",
         _metrics('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n'),
         "no line has layer_imbalance"),
    Case("balance-run-dir-not-an-object", "bench balance --run-dir",
         "a line that is a JSON array", _metrics('[1, 2, 3]\n' + GOOD), "line 1"),
]
