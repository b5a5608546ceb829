"""TensorBoard event files written by the engine read back with the tensorboard package:
its record reader (which checks both CRCs), the legacy EventAccumulator, and the plugin
accumulator the TensorBoard UI uses (which migrates simple_value/histo/image summaries
into its scalars/histograms/images plugins). Then the events of a short training run:
per-layer load scalars and histograms at log steps, the load heatmap image at eval steps.

Run by ctest with the interop environment's Python; TENSORBOARD_TOOL names
tests/train/tensorboard_tool (see that file for the summaries it writes), SWITCHYARD the
binary.
"""
import io
import os
import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util

from sy_testing import SWITCHYARD, TINY_RECIPE as TINY, binary, run

TOOL = binary("TENSORBOARD_TOOL")
STEPS = range(5)
HIST_VALUES = [i * 0.5 - 3 for i in range(100)] + [1e6]
HEIGHT, WIDTH = 6, 10


def expected_pixels():
    return np.array([[[25 * x, 40 * y, 128] for x in range(WIDTH)] for y in range(HEIGHT)],
                    dtype=np.uint8)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("tb") / "run"
    result = run([TOOL, log_dir], timeout=None)
    path = result.stdout.strip()
    assert os.path.dirname(path) == str(log_dir)
    return log_dir, path


def test_file_name(log):
    log_dir, path = log
    assert os.listdir(log_dir) == [os.path.basename(path)]
    assert re.fullmatch(r"events\.out\.tfevents\.\d{10}\.[^/]+\.\d+\.switchyard",
                        os.path.basename(path)), path


def test_records_framing_and_crcs(log):
    _, path = log
    data = open(path, "rb").read()
    at, count = 0, 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert length_crc == masked_crc32c(header)
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert body_crc == masked_crc32c(body)
        at += 16 + length
        count += 1
    assert at == len(data)
    assert count == 1 + 2 * len(STEPS) + 2


def test_raw_events(log):
    _, path = log
    events = list(event_file_loader.LegacyEventFileLoader(path).Load())
    assert events[0].file_version == "brain.Event:2"
    assert events[0].wall_time > 1.6e9
    assert all(e.wall_time >= events[0].wall_time for e in events)
    tags = [v.tag for e in events[1:] for v in e.summary.value]
    assert tags == ["train/loss", "train/lr"] * len(STEPS) + ["moe/expert_load",
                                                             "samples/gradient"]


def test_scalars_histogram_image_via_event_accumulator(log):
    log_dir, _ = log
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0,
        event_accumulator.IMAGES: 0})
    acc.Reload()
    tags = acc.Tags()
    assert sorted(tags["scalars"]) == ["train/loss", "train/lr"]
    assert tags["histograms"] == ["moe/expert_load"]
    assert tags["images"] == ["samples/gradient"]

    loss = acc.Scalars("train/loss")
    assert [s.step for s in loss] == list(STEPS)
    assert [s.value for s in loss] == pytest.approx([4 / (s + 1) for s in STEPS], rel=1e-6)
    lr = acc.Scalars("train/lr")
    assert [s.step for s in lr] == list(STEPS)
    assert [s.value for s in lr] == pytest.approx([1e-3 * s for s in STEPS], rel=1e-6)

    (hist_event,) = acc.Histograms("moe/expert_load")
    h = hist_event.histogram_value
    assert hist_event.step == 4
    assert h.min == -3.0 and h.max == 1e6
    assert h.num == len(HIST_VALUES)
    assert h.sum == pytest.approx(sum(HIST_VALUES))
    assert h.sum_squares == pytest.approx(sum(v * v for v in HIST_VALUES))
    assert len(h.bucket) == len(h.bucket_limit)
    assert sum(h.bucket) == len(HIST_VALUES)
    assert list(h.bucket_limit) == sorted(h.bucket_limit)
    # Each value falls in the bucket whose range [previous limit, limit) holds it.
    limits = np.array(h.bucket_limit)
    counts = np.zeros(len(limits))
    for v in HIST_VALUES:
        counts[np.searchsorted(limits, v, side="right")] += 1
    assert counts.tolist() == list(h.bucket)

    (image,) = acc.Images("samples/gradient")
    assert image.step == 4
    assert (image.height, image.width) == (HEIGHT, WIDTH)
    png = image.encoded_image_string
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (WIDTH, HEIGHT)
    # Decoded by Pillow and, independently, inflated by zlib.
    decoded = Image.open(io.BytesIO(png))
    assert decoded.format == "PNG" and decoded.mode == "RGB"
    assert decoded.size == (WIDTH, HEIGHT)
    np.testing.assert_array_equal(np.asarray(decoded), expected_pixels())
    (idat_len,) = struct.unpack(">I", png[33:37])
    assert png[37:41] == b"IDAT"
    raw = np.frombuffer(zlib.decompress(png[41:41 + idat_len]), dtype=np.uint8)
    rows = raw.reshape(HEIGHT, 1 + 3 * WIDTH)
    assert (rows[:, 0] == 0).all()
    np.testing.assert_array_equal(rows[:, 1:].reshape(HEIGHT, WIDTH, 3), expected_pixels())


def test_plugin_accumulator_as_the_ui_reads_it(log):
    log_dir, _ = log
    acc = plugin_event_accumulator.EventAccumulator(str(log_dir), size_guidance={
        plugin_event_accumulator.TENSORS: 0})
    acc.Reload()
    content = acc.PluginTagToContent
    assert set(content("scalars")) == {"train/loss", "train/lr"}
    assert set(content("histograms")) == {"moe/expert_load"}
    assert set(content("images")) == {"samples/gradient"}
    loss = acc.Tensors("train/loss")
    assert [t.step for t in loss] == list(STEPS)
    assert [float(tensor_util.make_ndarray(t.tensor_proto)) for t in loss] == pytest.approx(
        [4 / (s + 1) for s in STEPS], rel=1e-6)
    (hist,) = acc.Tensors("moe/expert_load")
    buckets = tensor_util.make_ndarray(hist.tensor_proto)  # rows of [left, right, count]
    assert buckets.shape[1] == 3
    assert buckets[:, 2].sum() == len(HIST_VALUES)
    assert buckets[0, 0] == -3.0
    (img,) = acc.Tensors("samples/gradient")
    width, height, png = tensor_util.make_ndarray(img.tensor_proto)
    assert (int(width), int(height)) == (WIDTH, HEIGHT)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_log_dir_that_is_a_file_fails_cleanly(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = run([TOOL, not_a_dir], expect=1, timeout=None)
    assert result.stderr.count("\n") == 1 and "not a directory" in result.stderr.lower(), result.stderr


# A short run of the tiny recipe (4 MoE layers, 8 experts, top-2), shrunk to micro-batches
# of 4 x 64 tokens, with a capacity factor so that drops happen.
RUN_STEPS, LOG_EVERY, EVAL_EVERY = 8, 4, 4
LAYERS, EXPERTS, TOP_K, MICRO_TOKENS = 4, 8, 2, 4 * 64
HEATMAP_CELL = 24


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    run_dir = tmp / "run"
    run([SWITCHYARD, "train", TINY, "--run-dir", run_dir, "--dataset-cache", tmp / "cache",
         "--set", f"train.steps={RUN_STEPS}", "--set", f"train.log_interval={LOG_EVERY}",
         "--set", "train.seq_len=64", "--set", "train.global_batch_size=8",
         "--set", "train.micro_batch_size=4",
         "--set", f"train.eval_interval={EVAL_EVERY}", "--set", "train.eval_batches=1",
         "--set", "optimizer.warmup_steps=2", "--set", "checkpoint.interval_steps=0",
         "--set", "moe.capacity_factor=1.0"], timeout=240)
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0,
        event_accumulator.IMAGES: 0})
    acc.Reload()
    return acc


def test_per_layer_imbalance_and_drops_at_log_steps(training_run):
    tags = training_run.Tags()["scalars"]
    log_steps = list(range(LOG_EVERY, RUN_STEPS + 1, LOG_EVERY))
    any_dropped = False
    for layer in range(LAYERS):
        imbalance = training_run.Scalars(f"moe/layer_{layer}/imbalance")
        assert [s.step for s in imbalance] == log_steps
        assert all(1.0 <= s.value <= EXPERTS for s in imbalance)
        dropped = training_run.Scalars(f"moe/layer_{layer}/dropped")
        assert [s.step for s in dropped] == log_steps
        assert all(0.0 <= s.value < 1.0 for s in dropped)
        # At capacity factor 1 an expert above the mean load drops its excess.
        for i, d in zip(imbalance, dropped):
            assert (d.value > 0) == (i.value > 1.0 + 1e-6), (layer, i, d)
            any_dropped |= d.value > 0
    assert any_dropped
    assert f"moe/layer_{LAYERS}/imbalance" not in tags


def test_per_layer_spread_and_dead_experts_follow_the_histogram(training_run):
    for layer in range(LAYERS):
        cv = training_run.Scalars(f"moe/layer_{layer}/cv")
        dead = training_run.Scalars(f"moe/layer_{layer}/dead_experts")
        hist = training_run.Histograms(f"moe/layer_{layer}/tokens_per_expert")
        assert [s.step for s in cv] == [s.step for s in dead] == [h.step for h in hist]
        for c, d, h in zip(cv, dead, hist):
            v = h.histogram_value
            mean = v.sum / v.num
            std = max(0.0, v.sum_squares / v.num - mean * mean) ** 0.5
            assert abs(c.value - std / mean) < 1e-4, (layer, c, std / mean)
            assert 0 <= d.value <= EXPERTS - TOP_K and d.value == int(d.value)
            assert (d.value > 0) <= (v.min == 0), (layer, d, v.min)


def test_per_layer_tokens_per_expert_histograms(training_run):
    hist_tags = training_run.Tags()["histograms"]
    for layer in range(LAYERS):
        tag = f"moe/layer_{layer}/tokens_per_expert"
        assert tag in hist_tags
        events = training_run.Histograms(tag)
        assert [e.step for e in events] == list(range(LOG_EVERY, RUN_STEPS + 1, LOG_EVERY))
        for e in events:
            h = e.histogram_value
            # One value per expert, together every top-k choice of one micro-batch.
            assert h.num == EXPERTS
            assert h.sum == MICRO_TOKENS * TOP_K
            assert 0 <= h.min <= h.max <= MICRO_TOKENS


def test_load_heatmap_image_at_eval_steps(training_run):
    images = training_run.Images("moe/load_heatmap")
    assert [i.step for i in images] == [0, EVAL_EVERY, RUN_STEPS]
    height, width = LAYERS * HEATMAP_CELL + 1, EXPERTS * HEATMAP_CELL + 1
    for event in images:
        assert (event.height, event.width) == (height, width)
        with Image.open(io.BytesIO(event.encoded_image_string)) as decoded:
            assert decoded.format == "PNG" and decoded.mode == "RGB"
            assert decoded.size == (width, height)
            pixels = np.asarray(decoded).astype(int)
        # One-pixel grey grid lines around the cells.
        assert (pixels[::HEATMAP_CELL, :] == 204).all()
        assert (pixels[:, ::HEATMAP_CELL] == 204).all()
        # Each cell one colour of the scale (white -> (255, 128, 128) at the uniform share
        # -> (155, 0, 0) at twice that, green = blue = 255 (1 - share E / 2)); the shares
        # it encodes sum to about 1 in every layer.
        for layer in range(LAYERS):
            shares = []
            for expert in range(EXPERTS):
                y, x = layer * HEATMAP_CELL, expert * HEATMAP_CELL
                cell = pixels[y + 1:y + HEATMAP_CELL, x + 1:x + HEATMAP_CELL]
                r, g, b = cell[0, 0]
                assert (cell == cell[0, 0]).all()
                t = 1 - g / 255
                assert g == b and abs(r - (255 - 200 * max(0.0, t - 0.5))) <= 1, (r, g, b)
                shares.append(t * 2 / EXPERTS)
            if max(shares) < 2 / EXPERTS:  # no cell saturated at twice the uniform share
                assert sum(shares) == pytest.approx(1.0, abs=0.02), shares
