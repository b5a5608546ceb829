"""`data prepare` at scale, through the binary: a prepare killed (SIGKILL) once it has
recorded a complete shard, run again with the same arguments, says that it resumed and
ends with the bytes of an uninterrupted run; two `--part` processes running at once and
`data merge-parts` give the token streams of a one-process prepare; merge-parts refuses a
missing part in one line.

Run by ctest; SWITCHYARD names the binary.
"""
import json
import signal
import subprocess
import time
from pathlib import Path

import h5py

from sy_testing import SWITCHYARD, run


def prepare_args(tokenizer, inputs, out, *extra):
    """data prepare of the inputs (conftest.py's prepare_inputs) in shards of 100000 tokens."""
    return [SWITCHYARD, "data", "prepare", "--tokenizer", str(tokenizer), "--input",
            *map(str, inputs), "--out", str(out), "--shard-tokens", "100000",
            "--val-fraction", "0.02", "--threads", "1", *extra]


def split_stream(directory, split):
    """A split's tokens and document ends, read with h5py through index.json."""
    index = json.loads((Path(directory) / "index.json").read_text())
    tokens, ends = [], []
    for shard in index["splits"][split]:
        with h5py.File(Path(directory) / shard["file"], "r") as f:
            ends += [len(tokens) + int(e) for e in f["doc_offsets"][1:]]
            tokens += f["tokens"][:].tolist()
    return tokens, ends


def files_of(directory):
    return {p.name: p.read_bytes() for p in Path(directory).iterdir()}


def test_a_killed_prepare_resumes_to_the_same_bytes(tmp_path, prepare_inputs):
    tokenizer, inputs = prepare_inputs
    run(prepare_args(tokenizer, inputs, tmp_path / "whole"), timeout=None)
    out = tmp_path / "killed"
    record = out / "part-00000-of-00001.json"
    child = subprocess.Popen(prepare_args(tokenizer, inputs, out), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    while not record.exists() and child.poll() is None:
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, "prepare finished before it could be killed"
    assert not (out / "index.json").exists()

    result = run(prepare_args(tokenizer, inputs, out), timeout=None)
    assert "resuming" in result.stdout and "shards were complete already" in result.stdout, \
        result.stdout
    assert files_of(out) == files_of(tmp_path / "whole")

    # The same command with another option is refused, and says how to start over.
    out2 = tmp_path / "killed2"
    child = subprocess.Popen(prepare_args(tokenizer, inputs, out2), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    while not (out2 / "part-00000-of-00001.json").exists() and child.poll() is None:
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    child.wait()
    result = run(prepare_args(tokenizer, inputs, out2)[:-2] + ["--threads", "2",
                 "--text-field", "body"], expect=1, timeout=None)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "other arguments" in lines[0] and "start over" in lines[0], lines


def test_parts_in_parallel_merge_into_the_dataset_of_one_process(tmp_path, prepare_inputs):
    tokenizer, inputs = prepare_inputs
    run(prepare_args(tokenizer, inputs, tmp_path / "whole"), timeout=None)
    out = tmp_path / "parts"
    children = [subprocess.Popen(prepare_args(tokenizer, inputs, out, "--part", f"{i}/2"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(2)]
    for child in children:
        stdout, stderr = child.communicate()
        assert child.returncode == 0, stderr
        assert "data merge-parts" in stdout
    result = run([SWITCHYARD, "data", "merge-parts", out], timeout=None)
    assert f"merged {out}: train " in result.stdout, result.stdout

    for split in ("train", "val"):
        assert split_stream(out, split) == split_stream(tmp_path / "whole", split), split


def test_merge_refuses_a_missing_part(tmp_path, prepare_inputs):
    tokenizer, inputs = prepare_inputs
    out = tmp_path / "parts"
    run(prepare_args(tokenizer, inputs, out, "--part", "0/3"), timeout=None)
    result = run([SWITCHYARD, "data", "merge-parts", out], expect=1, timeout=None)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "part-00001-of-00003.json: missing: part 1/3" in lines[0], lines
