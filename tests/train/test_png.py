"""PNGs from the engine's own encoder (engine/train/png.h: stored deflate blocks, CRC-32,
Adler-32) decoded by Pillow and by zlib: the pixels come back exactly, from one pixel up
to images whose scanlines span several deflate blocks.

Run by ctest with the interop environment's Python; PNG_TOOL names tests/train/png_tool.
"""
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from sy_testing import binary, run

TOOL = binary("PNG_TOOL")


def expected_pixels(height, width):
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([(x * 7 + y) % 256, (y * 5 + x // 3) % 256, ((x ^ y) * 11) % 256],
                    axis=-1).astype(np.uint8)


def encode(tmp_path, height, width):
    path = tmp_path / f"{height}x{width}.png"
    run([TOOL, path, height, width], timeout=None)
    return path


# 300 x 250 is 225 kB of scanlines: four stored blocks.
@pytest.mark.parametrize("height,width", [(1, 1), (6, 10), (7, 1), (1, 300), (300, 250)])
def test_pillow_decodes_the_pixels(tmp_path, height, width):
    path = encode(tmp_path, height, width)
    with Image.open(path) as image:
        image.load()  # Pillow checks every chunk CRC here
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.size == (width, height)
        np.testing.assert_array_equal(np.asarray(image), expected_pixels(height, width))


def test_zlib_inflates_the_stream_and_checks_adler32(tmp_path):
    data = encode(tmp_path, 300, 250).read_bytes()
    at, idat = 8, b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IDAT":
            idat += body
        at += 12 + length
    assert at == len(data)
    raw = zlib.decompress(idat)  # raises on a bad Adler-32
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(300, 1 + 3 * 250)
    assert (rows[:, 0] == 0).all()
    np.testing.assert_array_equal(rows[:, 1:].reshape(300, 250, 3), expected_pixels(300, 250))


def test_bad_size_is_one_line_error(tmp_path):
    result = run([TOOL, tmp_path / "x.png", "0", "5"], expect=1, timeout=None)
    assert result.stderr.count("\n") == 1 and "must be positive" in result.stderr
    assert not (tmp_path / "x.png").exists()
