#!/usr/bin/env python3
"""Draws one pipeline step as a timeline: per rank, its forwards, backwards and exchanges
(posting messages and waiting for them) as recorded by the pipeline executor, the gaps
between them idle. Each pass is labelled with its micro-batch (and chunk when a rank
holds several). Writes a PNG.

    scripts/pipeline_timeline.py EVENTS.rank0.jsonl EVENTS.rank1.jsonl ... --out FILE.png
                                 [--step S] [--title TEXT]

The inputs are the JSON lines of engine/parallel/pipeline_executor.h
(pipeline_events_json_lines), one file per pipeline rank, as bench/pipeline_bubble
writes them with --events. Every line is checked; a bad one is refused in one line
naming the file, the line and the field. Needs Pillow (in the interop environment).
"""
import argparse
import json
import math
import os
import stat
import sys

from PIL import Image, ImageDraw, ImageFont

MAX_FILE_BYTES = 64 << 20
MAX_EVENTS = 1 << 20
MAX_RANKS = 64
MAX_SECONDS = 1e6
KINDS = ("forward", "backward", "exchange")
INT_FIELDS = ("step", "rank", "micro_batch", "chunk", "sends", "receives")
COLORS = {"forward": (66, 133, 244), "backward": (52, 168, 83), "exchange": (234, 67, 53),
          "idle": (235, 235, 235)}
LEGEND = (("forward", "forward"), ("backward", "backward"),
          ("exchange", "send/receive (posting and waiting)"), ("idle", "idle"))
WIDTH, LEFT, RIGHT, ROW, GAP, TOP = 1400, 150, 30, 46, 12, 70


class BadInput(Exception):
    pass


def checked_event(line, where):
    try:
        event = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise BadInput(f"{where}: not JSON ({e})")
    if not isinstance(event, dict):
        raise BadInput(f"{where}: not a JSON object")
    for field in INT_FIELDS:
        value = event.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value < 1 << 31:
            raise BadInput(f"{where}: field {field} must be an integer in [-1, 2^31)")
    if event.get("kind") not in KINDS:
        raise BadInput(f"{where}: field kind must be one of {', '.join(KINDS)}")
    for field in ("start_s", "end_s"):
        value = event.get(field)
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or not 0 <= value <= MAX_SECONDS):
            raise BadInput(f"{where}: field {field} must be seconds in [0, {MAX_SECONDS:g}]")
    if event["end_s"] < event["start_s"]:
        raise BadInput(f"{where}: field end_s is before start_s")
    return event


def read_rank(path, step):
    """The events of `step` (the file's first step when None) in one rank's file."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path}: not a regular file")
        size = info.st_size
        if size > MAX_FILE_BYTES:
            raise BadInput(f"{path}: {size} bytes, at most {MAX_FILE_BYTES}")
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot read ({e})")
    if len(lines) > MAX_EVENTS:
        raise BadInput(f"{path}: {len(lines)} events, at most {MAX_EVENTS}")
    events = [checked_event(line, f"{path} line {n + 1}") for n, line in enumerate(lines)]
    if step is None and events:
        step = events[0]["step"]
    events = [e for e in events if e["step"] == step]
    if not events:
        raise BadInput(f"{path}: no events of step {step}")
    if len({e["rank"] for e in events}) != 1:
        raise BadInput(f"{path}: events of more than one rank")
    return events


def read_ranks(paths, step):
    if not 1 <= len(paths) <= MAX_RANKS:
        raise BadInput(f"{len(paths)} files: give 1 to {MAX_RANKS}, one per rank")
    ranks = {}
    for path in paths:
        events = read_rank(path, step)
        rank = events[0]["rank"]
        if rank in ranks:
            raise BadInput(f"{path}: rank {rank} given twice")
        ranks[rank] = events
    return dict(sorted(ranks.items()))


def font(size):
    return ImageFont.load_default(size=size)


def label(event, chunked):
    text = ("F" if event["kind"] == "forward" else "B") + str(event["micro_batch"])
    return text + f".{event['chunk']}" if chunked else text


def tick_step(seconds):
    """A round tick spacing in seconds giving 5 to 10 ticks."""
    raw = seconds / 8
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def draw_axis(draw, y, end_s, scale):
    draw.line([(LEFT, y), (WIDTH - RIGHT, y)], fill="black")
    tick = tick_step(end_s)
    for i in range(int(end_s / tick) + 1):
        x = LEFT + i * tick * scale
        draw.line([(x, y), (x, y + 5)], fill="black")
        draw.text((x, y + 8), f"{i * tick * 1e3:g}", fill="black", font=font(13), anchor="mt")
    draw.text(((LEFT + WIDTH - RIGHT) / 2, y + 28), "time since the step began (ms)",
              fill="black", font=font(14), anchor="mt")


def draw_legend(draw, y):
    x = LEFT
    for kind, text in LEGEND:
        draw.rectangle([x, y, x + 18, y + 18], fill=COLORS[kind], outline="black")
        draw.text((x + 24, y + 9), text, fill="black", font=font(14), anchor="lm")
        x += 24 + draw.textlength(text, font=font(14)) + 30


def draw_rank(draw, y, rank, events, scale, end_s, chunked):
    busy = sum(e["end_s"] - e["start_s"] for e in events if e["kind"] != "exchange")
    draw.text((10, y + ROW / 2 - 8), f"rank {rank}", fill="black", font=font(16), anchor="lm")
    draw.text((10, y + ROW / 2 + 10), f"busy {100 * busy / end_s:.0f}%", fill=(90, 90, 90),
              font=font(12), anchor="lm")
    draw.rectangle([LEFT, y, LEFT + end_s * scale, y + ROW], fill=COLORS["idle"])
    for e in events:
        x0, x1 = LEFT + e["start_s"] * scale, LEFT + e["end_s"] * scale
        draw.rectangle([x0, y, max(x0, x1), y + ROW], fill=COLORS[e["kind"]], outline="white")
        if e["kind"] != "exchange":
            text = label(e, chunked)
            if draw.textlength(text, font=font(13)) + 4 < x1 - x0:
                draw.text(((x0 + x1) / 2, y + ROW / 2), text, fill="white", font=font(13),
                          anchor="mm")


def render(ranks, title, out):
    end_s = max(e["end_s"] for events in ranks.values() for e in events)
    if end_s <= 0:
        raise BadInput("every event ends at 0 s: nothing to draw")
    chunked = any(e["chunk"] > 0 for events in ranks.values() for e in events)
    scale = (WIDTH - LEFT - RIGHT) / end_s
    height = TOP + len(ranks) * (ROW + GAP) + 60
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((LEFT, 12), title, fill="black", font=font(18))
    draw_legend(draw, 40)
    y = TOP
    for rank, events in ranks.items():
        draw_rank(draw, y, rank, events, scale, end_s, chunked)
        y += ROW + GAP
    draw_axis(draw, y + 4, end_s, scale)
    partial = out + ".partial"
    image.save(partial, format="PNG")
    os.replace(partial, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("events", nargs="+", help="one JSON-lines file per pipeline rank")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--step", type=int, help="the step to draw (default: each file's first)")
    parser.add_argument("--title", default="pipeline step", help="the picture's title")
    args = parser.parse_args()
    try:
        render(read_ranks(args.events, args.step), args.title, args.out)
    except BadInput as e:
        print(f"pipeline_timeline: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
