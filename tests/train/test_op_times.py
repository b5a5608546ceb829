"""`train --op-times`: every logged step records where its time went by kind of work
(core/runtime/op_clock.h), the kinds account for the step, and the run ends with the table;
without the switch nothing is timed or printed.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
from pathlib import Path

from sy_testing import SWITCHYARD, TINY_RECIPE, run

SMALL = ["--set", "model.num_layers=2", "--set", "train.seq_len=64",
         "--set", "train.steps=4", "--set", "train.log_interval=2",
         "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2",
         "--set", "train.eval_interval=0", "--set", "checkpoint.interval_steps=0"]
KINDS = ["data", "embedding", "norms", "attention projections", "attention core", "router",
         "dispatch", "experts", "combine", "shared experts", "dense ffn", "head and loss",
         "gradient sync", "optimizer", "other"]
# What every step of the tiny MoE model does (it has no shared experts or dense layers).
WORKING = {"forward_s": ["norms", "attention projections", "attention core", "router",
                         "dispatch", "experts", "combine", "head and loss"],
           "backward_s": ["norms", "attention projections", "attention core", "router",
                          "dispatch", "experts", "combine", "head and loss", "optimizer"]}


def train(run_dir, *extra, ranks=1):
    return run([SWITCHYARD, "train", TINY_RECIPE, "--run-dir", run_dir, *SMALL, *extra],
               ranks=ranks, threads=1, timeout=600).stdout


def steps(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "loss" in m]


def test_each_logged_step_says_where_its_time_went(tmp_path):
    out = train(tmp_path / "run", "--op-times")
    records = steps(tmp_path / "run")
    assert [r["step"] for r in records] == [2, 4]
    previous_s = None
    for r in records:
        times = r["op_times"]
        assert list(times) == KINDS
        for kind, passes in times.items():
            assert all(s >= 0 for s in passes.values()), kind
        for which, kinds in WORKING.items():
            assert all(times[k][which] > 0 for k in kinds), (which, times)
        step_s = sum(s for passes in times.values() for s in passes.values())
        # The kinds add up to the step, which the window of two steps holds with its logging;
        # the scopes leave little of it to "other".
        if previous_s is not None:
            assert step_s <= (r["elapsed_s"] - previous_s) / 2
        previous_s = r["elapsed_s"]
        assert times["other"]["forward_s"] < step_s / 2
    table = out[out.index("where a step went on rank 0 (mean of 3 steps"):]
    assert "GFLOP/s" in table and "\nexperts " in table and "\noptimizer " in table


def test_a_run_without_the_switch_times_nothing(tmp_path):
    out = train(tmp_path / "run")
    assert all("op_times" not in r for r in steps(tmp_path / "run"))
    assert "where a step went" not in out


def test_expert_parallel_ranks_time_their_exchange(tmp_path):
    out = train(tmp_path / "run", "--op-times", "--set", "parallel.expert_parallel_size=2",
                ranks=2)
    for r in steps(tmp_path / "run"):
        assert r["op_times"]["dispatch"]["forward_s"] > 0
        assert r["op_times"]["combine"]["backward_s"] > 0
    assert "GFLOP/s" in out[out.index("where a step went on rank 0"):]


def test_tensor_parallel_ranks_report_times_without_flop_rates(tmp_path):
    out = train(tmp_path / "run", "--op-times", "--set", "parallel.tensor_parallel_size=2",
                ranks=2)
    table = out[out.index("where a step went on rank 0"):]
    # A rank holds part of each layer: the FLOPs per token are not its own, so each row has
    # its share of the step and no rate against the peak.
    rows = table.split("\nsaved final weights")[0].splitlines()[2:]
    assert any(row.startswith("experts ") for row in rows)
    assert all(row.count("%") == 1 for row in rows)
