"""The `bench balance --compare` HTML report rendered by headless Chromium: the screenshot
is not blank and shows every heatmap cell in the colour its share maps to, and the page
loads without script or console errors (it has no scripts; --dump-dom shows the DOM
Chromium built).

Run by ctest with the interop environment's Python; SWITCHYARD names the binary.
Chromium is the Debian package that scripts/setup.sh installs.
"""
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from sy_testing import SWITCHYARD, TINY_RECIPE, run

WIDTH, HEIGHT = 1200, 900
CELL = 28  # the report's heatmap cell, in CSS pixels


def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium is not installed (scripts/setup.sh installs it)"
    return path


def load_color(share, experts):
    """moe/balance_stats.h load_color: white -> light red at 1/E -> dark red at 2/E."""
    t = min(1.0, max(0.0, share * experts / 2.0))
    g = int(np.floor(255 * (1 - t) + 0.5))
    r = int(np.floor(255 - 100 * max(0.0, t - 0.5) * 2 + 0.5))
    return (r, g, g)


def run_chromium(tmp_path, *args):
    # A profile of its own, so no other Chromium's lock or settings get in the way.
    return run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--force-color-profile=srgb", "--enable-logging=stderr", "--v=0",
                f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
                *args], expect=None, timeout=60)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    run([SWITCHYARD, "bench", "balance", TINY_RECIPE, "--synthetic", "zipf:1.1", "--batches", "1",
         "--compare", "top_k=1,2", "--json", tmp / "b.json", "--report", tmp / "b.html"],
        timeout=120)
    return tmp, json.loads((tmp / "b.json").read_text()), tmp / "b.html"


def test_page_loads_without_errors(report, tmp_path):
    _, stats, html = report
    text = html.read_text()
    assert "<script" not in text and "http" not in text.replace("http://www.w3.org/2000/svg", "")
    result = run_chromium(tmp_path, "--dump-dom", html.as_uri())
    assert result.returncode == 0, result.stderr
    dom = result.stdout
    assert "<title>Expert load balance: tiny</title>" in dom
    # Heatmaps and statistics (no all-to-all without --ep); a heatmap per variant.
    assert dom.count("<section>") == 2
    assert dom.count("<figure>") == len(stats["variants"]) == 2
    assert dom.count("<rect ") == 2 * 4 * 8 + 1  # variants x layers x experts, the legend
    assert "1/E = 12.5% (uniform)" in dom
    assert "<figcaption>top_k=1</figcaption>" in dom and "<figcaption>top_k=2</figcaption>" in dom
    for line in result.stderr.splitlines():
        assert "CONSOLE" not in line and "Uncaught" not in line, line


def test_screenshot_shows_the_heatmaps(report, tmp_path):
    _, stats, html = report
    shot = tmp_path / "shot.png"
    result = run_chromium(tmp_path, f"--screenshot={shot}", html.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    # Not blank: plenty of non-white pixels and of distinct colours (text, cells, grid).
    non_white = (pixels != 255).any(axis=-1)
    assert non_white.mean() > 0.02, non_white.mean()
    colours, counts = np.unique(pixels.reshape(-1, 3), axis=0, return_counts=True)
    assert len(colours) > 20
    found = {tuple(int(v) for v in c): int(n) for c, n in zip(colours, counts)}
    # Every cell's colour is there, over at least its inside ((CELL - 2)^2 pixels, inside
    # the grey stroke) times the cells that share it.
    expected = {}
    for variant in stats["variants"]:
        for layer in variant["layers"]:
            experts = len(layer["share"])
            for share in layer["share"]:
                colour = load_color(share, experts)
                expected[colour] = expected.get(colour, 0) + 1
    assert len(expected) > 4  # a zipf load is not uniform
    for colour, cells in expected.items():
        assert found.get(colour, 0) >= cells * (CELL - 2) ** 2, (colour, cells, found.get(colour))
