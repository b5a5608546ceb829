"""`data prepare` streams: its peak resident memory does not grow with the input (the
corpus repeated to 9 MB and to 70 MB, two encoding threads) and stays under the bound
docs/data.md states; a line longer than the 64 MiB a document may hold is refused in one
line instead of being read whole.

Run by ctest; SWITCHYARD names the binary.
"""
import subprocess
import sys

from sy_testing import CORPUS, SWITCHYARD

MIB = 1 << 20


# Runs argv[1:] and prints its exit status and peak resident memory (KiB). A small
# interpreter of its own runs it, because a child's peak counts the memory of the process
# it was forked or spawned from until its exec, and this one holds the test's inputs.
MEASURE = """
import os, sys
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def peak_rss(argv):
    """Runs argv; returns its exit status, stderr and peak resident memory in bytes."""
    result = subprocess.run([sys.executable, "-c", MEASURE, *[str(a) for a in argv]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status, kib = result.stdout.split()[-2:]
    return int(status), result.stderr, int(kib) * 1024


def test_peak_memory_does_not_grow_with_the_input(tmp_path, corpus_tokenizer):
    text = CORPUS.read_text()
    tokenizer = corpus_tokenizer(512)
    peaks = {}
    for copies in (8, 64):
        path = tmp_path / f"corpus{copies}.txt"
        path.write_text(text * copies)
        status, stderr, peaks[copies] = peak_rss(
            [SWITCHYARD, "data", "prepare", "--tokenizer", tokenizer,
             "--input", path, "--out", tmp_path / f"ds{copies}", "--threads", "2"])
        assert status == 0, stderr
    assert peaks[64] < peaks[8] + 32 * MIB, peaks
    assert peaks[64] < 400 * MIB, peaks


def test_a_line_past_the_document_limit_is_refused(tmp_path, corpus_tokenizer):
    """Refused having read at most the 64 MiB a document may hold, once: the peak is the
    binary's own (measured on the small corpus; a CUDA build maps its libraries) plus less
    than two copies of the line."""
    tokenizer = corpus_tokenizer(512)
    status, stderr, baseline = peak_rss(
        [SWITCHYARD, "data", "prepare", "--tokenizer", tokenizer, "--input", CORPUS,
         "--out", tmp_path / "small"])
    assert status == 0, stderr
    path = tmp_path / "one-line.jsonl"
    with open(path, "w") as f:
        f.write('{"text": "' + "a" * (65 * MIB) + '"}\n')
    status, stderr, peak = peak_rss(
        [SWITCHYARD, "data", "prepare", "--tokenizer", tokenizer, "--input", path,
         "--out", tmp_path / "ds"])
    assert status == 1
    assert len(stderr.strip().splitlines()) == 1
    assert "one-line.jsonl:1: a line longer than 67108864 bytes (64 MiB)" in stderr
    assert peak < baseline + 112 * MIB, (peak, baseline)
    assert not (tmp_path / "ds" / "index.json").exists()
