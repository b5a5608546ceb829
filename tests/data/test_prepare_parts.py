"""`data prepare` at scale, through the binary: a prepare killed (SIGKILL) once it has
recorded a complete shard, run again with the same arguments, says that it resumed and
ends with the bytes of an uninterrupted run; two `--part` processes running at once and
`data merge-parts` give the token streams of a one-process prepare; merge-parts refuses a
missing part in one line.

Run by ctest; SWITCHYARD names the binary.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import h5py

SWITCHYARD = os.environ["SWITCHYARD"]
CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus" / "tinyshakespeare.txt"


def setup_inputs(tmp_path):
    text = CORPUS.read_text()
    inputs = []
    for name in ("a.txt", "b.txt", "c.txt"):
        inputs.append(tmp_path / name)
        inputs[-1].write_text(text * 2)
    subprocess.run([SWITCHYARD, "data", "tokenizer", "--input", CORPUS, "--vocab-size", "512",
                    "--out", tmp_path / "tok.model"], check=True, capture_output=True)
    return inputs


def prepare_args(tmp_path, inputs, out, *extra):
    return [SWITCHYARD, "data", "prepare", "--tokenizer", tmp_path / "tok.model", "--input",
            *inputs, "--out", out, "--shard-tokens", "100000", "--val-fraction", "0.02",
            "--threads", "1", *extra]


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


def test_a_killed_prepare_resumes_to_the_same_bytes(tmp_path):
    inputs = setup_inputs(tmp_path)
    subprocess.run(prepare_args(tmp_path, inputs, tmp_path / "whole"), check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    record = out / "part-00000-of-00001.json"
    child = subprocess.Popen(prepare_args(tmp_path, inputs, out), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    while not record.exists() and child.poll() is None:
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, "prepare finished before it could be killed"
    assert not (out / "index.json").exists()

    result = subprocess.run(prepare_args(tmp_path, inputs, out), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stdout and "shards were complete already" in result.stdout, \
        result.stdout
    assert files_of(out) == files_of(tmp_path / "whole")

    # The same command with another option is refused, and says how to start over.
    out2 = tmp_path / "killed2"
    child = subprocess.Popen(prepare_args(tmp_path, inputs, out2), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    while not (out2 / "part-00000-of-00001.json").exists() and child.poll() is None:
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    child.wait()
    result = subprocess.run(prepare_args(tmp_path, inputs, out2)[:-2] + ["--threads", "2",
                            "--text-field", "body"], capture_output=True, text=True)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "other arguments" in lines[0] and "start over" in lines[0], lines


def test_parts_in_parallel_merge_into_the_dataset_of_one_process(tmp_path):
    inputs = setup_inputs(tmp_path)
    subprocess.run(prepare_args(tmp_path, inputs, tmp_path / "whole"), check=True,
                   capture_output=True)
    out = tmp_path / "parts"
    children = [subprocess.Popen(prepare_args(tmp_path, inputs, out, "--part", f"{i}/2"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(2)]
    for child in children:
        stdout, stderr = child.communicate()
        assert child.returncode == 0, stderr
        assert "data merge-parts" in stdout
    result = subprocess.run([SWITCHYARD, "data", "merge-parts", out], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert f"merged {out}: train " in result.stdout, result.stdout

    for split in ("train", "val"):
        assert split_stream(out, split) == split_stream(tmp_path / "whole", split), split


def test_merge_refuses_a_missing_part(tmp_path):
    inputs = setup_inputs(tmp_path)
    out = tmp_path / "parts"
    subprocess.run(prepare_args(tmp_path, inputs, out, "--part", "0/3"), check=True,
                   capture_output=True)
    result = subprocess.run([SWITCHYARD, "data", "merge-parts", out], capture_output=True,
                            text=True)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "part-00001-of-00003.json: missing: part 1/3" in lines[0], lines
