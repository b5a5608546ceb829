"""Data pipeline throughput: `switchyard data prepare` against the sentencepiece Python
package encoding the same text in the same run, the loader's tokens/s, and the tokens/s
the trainer consumes from the prepared dataset.

Runs, in order:
  1. `switchyard data tokenizer` trains a BPE model on data/corpus/tinyshakespeare.txt;
  2. the corpus is repeated to --megabytes of text and `switchyard data prepare` turns it
     into shards (timed as a whole process: reading, encoding on --threads cores, HDF5
     writing, checksums);
  3. sentencepiece (Python) encodes the same documents (blank-line-separated paragraphs)
     with the same model and thread count, timing encode() alone (no file I/O, no output);
  4. the loader reads shuffled windows of the prepared train split (tests/data token_tool);
  5. `switchyard train` runs recipes/tiny.textproto (its vocabulary widened to the
     tokenizer's) on the prepared dataset for --train-steps steps, and the mean tokens/s of
     its logged steps after the first is taken as the trainer's consumption;
  6. parts: the same text as --parts files, prepared by one process (--threads) and by
     --parts `data prepare --part I/N` processes at once (--threads / --parts each) and
     `data merge-parts`, both timed whole and checked to hold the same tokens; and the
     rate at which a part reads the files before its own without encoding them (`data
     prepare --part 1/2` of the whole text and one copy of the corpus, timed whole, so a
     lower bound).
Prints MB/s for both encoders, their ratio, tokens/s of prepare, the loader and the
trainer, and the parts' figures; optionally writes JSON.
Both encoders must produce the same ids, which the script checks (h5py reads the shards).

Run with the project Python environment, e.g.
  ~/.cache/switchyard/pyenv/bin/python bench/prepare_throughput.py \\
      --switchyard build/engine/cli/switchyard --token-tool build/tests/data_token_tool
"""

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import sentencepiece as spm

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data" / "corpus" / "tinyshakespeare.txt"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switchyard", required=True, help="path to the switchyard binary")
    p.add_argument("--token-tool", required=True, help="path to tests/data's token_tool binary")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--megabytes", type=float, default=25.0, help="text to prepare")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--seq", type=int, default=1024, help="loader window length")
    p.add_argument("--global-batch", type=int, default=32, help="loader windows per step")
    p.add_argument("--train-steps", type=int, default=20, help="steps of the tiny recipe")
    p.add_argument("--parts", type=int, default=2, help="--part processes to compare")
    p.add_argument("--json", help="also write the results here")
    return p.parse_args()


def paragraphs(text):
    """Documents as data/document_reader.h defines them for plain text."""
    documents, lines = [], []
    for line in text.split("\n"):
        if line in ("", "\r"):
            if lines:
                documents.append("\n".join(lines))
            lines = []
        else:
            lines.append(line)
    if lines:
        documents.append("\n".join(lines))
    return documents


def run(*cmd):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{result.stderr}")
    return result.stdout


def train_consumption(args, tmp):
    """Tokens/s of the tiny recipe training on the prepared dataset: the mean over its
    logged steps after the first (which includes start-up)."""
    run(args.switchyard, "train", REPO / "recipes" / "tiny.textproto", "--run-dir", tmp / "run",
        "--set", "data.corpus=", "--set", f"data.dataset={tmp / 'dataset'}",
        "--set", f"model.vocab_size={args.vocab_size}", "--set", f"train.steps={args.train_steps}",
        "--set", "train.eval_interval=0", "--set", "train.log_interval=1",
        "--set", "checkpoint.interval_steps=0")
    logged = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = [m["tokens_per_s"] for m in logged if "tokens_per_s" in m][1:]
    return sum(rates) / len(rates)


def train_tokens(directory):
    index = json.loads((directory / "index.json").read_text())
    return np.concatenate([h5py.File(directory / e["file"], "r")["tokens"][:]
                           for e in index["splits"]["train"]])


def parts_figures(args, tmp, model, corpus, repeats):
    """Seconds of one process and of --parts processes (with the merge) on the text as
    --parts files, and the MB/s of counting (reading without encoding) the whole text."""
    files = []
    for k in range(args.parts):
        copies = repeats * (k + 1) // args.parts - repeats * k // args.parts
        files.append(tmp / f"part{k}.txt")
        files[-1].write_text("\n\n".join([corpus.rstrip("\n")] * max(1, copies)) + "\n")
    common = ["--tokenizer", model, "--val-fraction", 0, "--input", *files]
    start = time.perf_counter()
    run(args.switchyard, "data", "prepare", *common, "--out", tmp / "one", "--threads", args.threads)
    one_s = time.perf_counter() - start
    threads = max(1, args.threads // args.parts)
    start = time.perf_counter()
    children = [subprocess.Popen([str(c) for c in [args.switchyard, "data", "prepare", *common,
                                  "--out", tmp / "parts", "--threads", threads,
                                  "--part", f"{i}/{args.parts}"]],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for i in range(args.parts)]
    for child in children:
        if child.wait() != 0:
            raise SystemExit(f"a --part process failed:\n{child.stderr.read()}")
    run(args.switchyard, "data", "merge-parts", tmp / "parts")
    parts_s = time.perf_counter() - start
    if not np.array_equal(train_tokens(tmp / "one"), train_tokens(tmp / "parts")):
        raise SystemExit("the merged parts' tokens differ from one process's")
    start = time.perf_counter()
    run(args.switchyard, "data", "prepare", "--tokenizer", model, "--val-fraction", 0,
        "--input", tmp / "input.txt", CORPUS, "--out", tmp / "count", "--threads", args.threads,
        "--part", "1/2")
    count_s = time.perf_counter() - start
    return one_s, parts_s, (tmp / "input.txt").stat().st_size / 1e6 / count_s


def main():
    args = parse_args()
    corpus = CORPUS.read_text(encoding="utf-8")
    repeats = max(1, round(args.megabytes * 1e6 / len(corpus.encode("utf-8"))))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "tok.model"
        run(args.switchyard, "data", "tokenizer", "--input", CORPUS, "--vocab-size",
            args.vocab_size, "--out", model)
        text_path = tmp / "input.txt"
        # A blank line between copies keeps the paragraphs (documents) of each copy intact.
        text = "\n\n".join([corpus.rstrip("\n")] * repeats) + "\n"
        text_path.write_text(text, encoding="utf-8")
        megabytes = text_path.stat().st_size / 1e6

        start = time.perf_counter()
        run(args.switchyard, "data", "prepare", "--tokenizer", model, "--input", text_path,
            "--out", tmp / "dataset", "--threads", args.threads, "--val-fraction", 0)
        engine_s = time.perf_counter() - start
        index = json.loads((tmp / "dataset" / "index.json").read_text())
        engine_ids = np.concatenate([h5py.File(tmp / "dataset" / e["file"], "r")["tokens"][:]
                                     for e in index["splits"]["train"]])
        engine_tokens = len(engine_ids)

        documents = paragraphs(text)
        sp = spm.SentencePieceProcessor(model_file=str(model))
        start = time.perf_counter()
        encoded = sp.encode(documents, num_threads=args.threads)
        python_s = time.perf_counter() - start
        python_ids = np.fromiter((i for ids in encoded for i in ids + [sp.eos_id()]), dtype=np.int64)
        if not np.array_equal(python_ids, engine_ids):
            raise SystemExit(f"the engine's ids differ from sentencepiece's "
                             f"({engine_tokens} and {len(python_ids)} tokens)")

        steps = max(1, (engine_tokens // args.seq) // args.global_batch)
        loader = json.loads(run(args.token_tool, "bench-loader", tmp / "dataset", args.seq,
                                args.global_batch, steps))
        trainer_tokens_per_s = train_consumption(args, tmp)
        one_s, parts_s, count_mb_per_s = parts_figures(args, tmp, model, corpus, repeats)

    results = {
        "megabytes": round(megabytes, 2),
        "tokens": engine_tokens,
        "threads": args.threads,
        "vocab_size": args.vocab_size,
        "engine_prepare_s": round(engine_s, 3),
        "engine_prepare_mb_per_s": round(megabytes / engine_s, 2),
        "python_sentencepiece_encode_s": round(python_s, 3),
        "python_sentencepiece_mb_per_s": round(megabytes / python_s, 2),
        "ratio_engine_over_python": round(python_s / engine_s, 3),
        "loader_seq_len": args.seq,
        "loader_global_batch": args.global_batch,
        "loader_tokens_per_s": round(loader["tokens_per_s"]),
        "engine_prepare_tokens_per_s": round(engine_tokens / engine_s),
        "trainer_tokens_per_s": round(trainer_tokens_per_s),
        "ratio_prepare_over_trainer": round(engine_tokens / engine_s / trainer_tokens_per_s, 1),
        "parts": args.parts,
        "one_process_s": round(one_s, 3),
        "parts_with_merge_s": round(parts_s, 3),
        "ratio_one_process_over_parts": round(one_s / parts_s, 3),
        "count_mb_per_s_at_least": round(count_mb_per_s, 1),
        "ratio_count_over_prepare_at_least": round(count_mb_per_s / (megabytes / engine_s), 1),
    }
    print(f"prepare {megabytes:.1f} MB, {engine_tokens} tokens, {args.threads} threads, "
          f"vocab {args.vocab_size}")
    print(f"  switchyard data prepare (whole process):  {results['engine_prepare_mb_per_s']:8.2f} MB/s")
    print(f"  sentencepiece Python encode() only:       {results['python_sentencepiece_mb_per_s']:8.2f} MB/s")
    print(f"  ratio engine / python:                    {results['ratio_engine_over_python']:8.3f}")
    print(f"loader (seq {args.seq}, global batch {args.global_batch}, shuffled windows): "
          f"{results['loader_tokens_per_s'] / 1e6:.1f}M tokens/s")
    print(f"prepare {results['engine_prepare_tokens_per_s'] / 1e6:.2f}M tokens/s, the tiny "
          f"recipe's training {results['trainer_tokens_per_s']} tokens/s: "
          f"{results['ratio_prepare_over_trainer']}x")
    print(f"{args.parts} files: one process {one_s:.2f} s, {args.parts} --part processes and "
          f"merge-parts {parts_s:.2f} s: {results['ratio_one_process_over_parts']}x")
    print(f"a part counting the documents before its own (read, not encoded): at least "
          f"{count_mb_per_s:.1f} MB/s, {results['ratio_count_over_prepare_at_least']}x prepare's")
    print(json.dumps(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
