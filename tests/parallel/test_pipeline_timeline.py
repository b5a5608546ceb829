"""The pipeline bubble benchmark under mpirun, its events drawn by
scripts/pipeline_timeline.py; the benchmark's refusals of bad arguments and the drawing
script's refusals of hostile event files (one line naming the file, line and field; no
traceback, no picture left behind).

    PIPELINE_BUBBLE=build/bench/pipeline_bubble MPIEXEC=$(which mpiexec) \\
        python tests/run_pytest.py tests/parallel/test_pipeline_timeline.py
"""
import json
import os
import sys

import pytest
from PIL import Image

from sy_testing import REPO, binary, run

SCRIPT = REPO / "scripts/pipeline_timeline.py"


def bench():
    """The benchmark's binary, asked for by the tests that run it alone."""
    return binary("PIPELINE_BUBBLE", REPO / "build/bench/pipeline_bubble")


def draw(*args):
    return run([sys.executable, SCRIPT, *args], expect=None, timeout=60)


def event(**fields):
    line = {"step": 0, "rank": 0, "kind": "forward", "micro_batch": 0, "chunk": 0, "sends": 0,
            "receives": 0, "start_s": 0.0, "end_s": 0.5}
    line.update(fields)
    return json.dumps(line)


def test_bench_events_are_drawn(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    result = run([bench(), "--cost", "sleep", "--forward-ms", "0.1", "--layers", "2",
                  "--micro-batches", "2", "--steps", "1", "--events", events],
                 ranks=2, timeout=120)
    assert "INTERLEAVED_1F1B" in result.stdout
    names = sorted(p.name for p in events.iterdir())
    assert names == sorted(f"{s}_p2_v{v}_m2.rank{r}.jsonl" for s, v in
                           (("GPIPE", 1), ("ONE_F_ONE_B", 1), ("INTERLEAVED_1F1B", 2))
                           for r in (0, 1))
    for name in names:
        lines = [json.loads(l) for l in (events / name).read_text().splitlines()]
        passes = [l for l in lines if l["kind"] != "exchange"]
        assert len(passes) == 2 * 2 * (2 if "INTERLEAVED" in name else 1), name
        assert {l["rank"] for l in lines} == {int(name[-7])}
    out = tmp_path / "timeline.png"
    result = draw(*sorted(events.glob("ONE_F_ONE_B_*")), "--out", out)
    assert result.returncode == 0, result.stderr
    with Image.open(out) as image:
        assert image.width == 1400 and image.height > 100


def test_a_file_of_several_steps_draws_the_one_asked(tmp_path):
    path = tmp_path / "r0.jsonl"
    path.write_text(event() + "\n" + event(step=1, end_s=2.0) + "\n")
    out = tmp_path / "t.png"
    assert draw(path, "--out", out, "--step", "1").returncode == 0
    result = draw(path, "--out", out, "--step", "2")
    assert result.returncode == 1
    assert "no events of step 2" in result.stderr


HOSTILE = {
    "not json": ("{", "line 1: not JSON"),
    "a list": ("[1]", "line 1: not a JSON object"),
    "missing rank": (json.dumps({"step": 0}), "field rank must be an integer"),
    "rank as text": (event(rank="0"), "field rank must be an integer"),
    "rank as bool": (event(rank=True), "field rank must be an integer"),
    "huge micro-batch": (event(micro_batch=1 << 40), "field micro_batch must be an integer"),
    "unknown kind": (event(kind="sleep"), "field kind must be one of"),
    "negative start": (event(start_s=-1.0), "field start_s must be seconds"),
    "NaN end": (event().replace("0.5", "NaN"), "field end_s must be seconds"),
    "huge end": (event(end_s=1e300), "field end_s must be seconds"),
    "end before start": (event(start_s=2.0, end_s=1.0), "field end_s is before start_s"),
    "deep nesting": ("[" * 100000 + "]" * 100000, "line 1: not"),
    "two ranks": (event() + "\n" + event(rank=1), "events of more than one rank"),
    "empty": ("", "no events of step"),
    "all at zero": (event(end_s=0.0), "nothing to draw"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_event_files_are_refused_in_one_line(tmp_path, case):
    text, reason = HOSTILE[case]
    path = tmp_path / "r0.jsonl"
    path.write_text(text)
    out = tmp_path / "t.png"
    result = draw(path, "--out", out)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("pipeline_timeline: ") and reason in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not out.exists() and not (tmp_path / "t.png.partial").exists()


def test_files_that_are_not_one_rank_each_are_refused(tmp_path):
    one = tmp_path / "a.jsonl"
    one.write_text(event())
    again = tmp_path / "b.jsonl"
    again.write_text(event())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args, reason in (((one, again), "rank 0 given twice"),
                         ((tmp_path / "missing.jsonl",), "cannot read"),
                         ((fifo,), "not a regular file"),
                         ((tmp_path,), "not a regular file")):
        result = draw(*args, "--out", tmp_path / "t.png")
        assert result.returncode == 1 and reason in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("args, reason", [
    (["--cost", "sleep", "--forward-ms", "nan"], "--forward-ms must be a number"),
    (["--size", "4096", "--layers", "64", "--micro-batches", "256"], "at most 4 GiB"),
    (["--micro-batches", "0"], "--micro-batches"),
    (["--events", "/nonexistent/dir"], "--events"),
    (["--cost", "sleep", "--forward-ms", "0"], "2 or more"),
])
def test_bad_benchmark_arguments_are_refused_in_one_line(args, reason):
    result = run([bench(), *args], expect=None, timeout=60)
    assert result.returncode != 0, result
    out = result.stdout + result.stderr
    assert reason in out, out


def test_mutated_event_files_are_drawn_or_refused(tmp_path):
    """A seeded fuzz of the reader: bytes of a valid file flipped, dropped or repeated give
    a picture or BadInput, never another exception."""
    import importlib.util
    import random
    spec = importlib.util.spec_from_file_location("pipeline_timeline", SCRIPT)
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    valid = (event() + "\n" + event(kind="exchange", micro_batch=-1, chunk=-1, sends=1,
                                      start_s=0.5, end_s=0.75) + "\n").encode()
    rng = random.Random(16)
    path, out = tmp_path / "r0.jsonl", str(tmp_path / "t.png")
    for _ in range(300):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            choice = rng.randrange(3)
            if choice == 0:
                data[i] = rng.randrange(256)
            elif choice == 1:
                del data[i]
            else:
                data[i:i] = data[i:i + rng.randint(1, 8)]
        path.write_bytes(bytes(data))
        try:
            timeline.render(timeline.read_ranks([str(path)], None), "fuzz", out)
        except timeline.BadInput:
            pass
