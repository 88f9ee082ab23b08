"""The pixel limit and libjpeg's memory cap: decompression bombs are refused from the header, cheaply, naming the file."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastpipe.ops.jpeg as jpeg
from fastpipe.datasets import DecodeCropOnDevice, EncodedBatch, ImageFolder
from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError
from tests.fakes.benchmark_scripts import load_benchmark

requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


@pytest.fixture(autouse=True)
def default_limit() -> None:
    """Every test starts and ends with the default (PIL's) limit."""
    jpeg._max_pixels_setting = jpeg._FOLLOW_PIL
    yield
    jpeg._max_pixels_setting = jpeg._FOLLOW_PIL


def _jpeg(size: tuple[int, int], **options: object) -> bytes:
    buf = io.BytesIO()
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    Image.fromarray(np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)).save(buf, "JPEG", **options)
    return buf.getvalue()


@pytest.fixture
def header_bomb(tmp_path: Path) -> Path:
    """A 16x16 JPEG of about 630 bytes whose frame header claims 60000x60000 (3.6 billion pixels)."""
    path = tmp_path / "cls" / "bomb.jpg"
    path.parent.mkdir()
    bombs = load_benchmark("jpeg_bomb_rss")
    path.write_bytes(bombs.set_frame_size(_jpeg((16, 16)), 60000, 60000))
    return path


@requires_op
def test_every_reader_refuses_the_header_bomb_naming_file_and_limit(header_bomb: Path) -> None:
    limit = str(Image.MAX_IMAGE_PIXELS)
    calls = {
        "jpeg_size": lambda: jpeg.jpeg_size(header_bomb),
        "decode_jpeg_crop": lambda: jpeg.decode_jpeg_crop(header_bomb, (0, 0, 100, 100), (8, 8)),
        "jpeg_entropy_floor": lambda: jpeg.jpeg_entropy_floor(header_bomb, 100),
        "ImageFolder": lambda: ImageFolder(header_bomb.parent.parent, size=8)[0],
    }
    for name, call in calls.items():
        with pytest.raises(DecompressionBombError) as info:
            call()
        message = str(info.value)
        assert str(header_bomb) in message and limit in message and "60000x60000" in message, (name, message)
    with pytest.raises(DecompressionBombError, match=rf"file #1 of the batch.*60000x60000.*{limit}"):
        DecodeCropOnDevice(8, device="cpu")(EncodedBatch([jpeg.read_bytes(_jpeg((32, 32))), jpeg.read_bytes(header_bomb)]))
    # The raw op, with the limit passed in, and the floor op: the same check in C++.
    data = jpeg.read_bytes(header_bomb)
    with pytest.raises(RuntimeError, match=rf"60000x60000 = 3600000000 pixels, over the pixel limit of {limit}"):
        torch.ops.fastpipe.decode_jpeg_crop(data, 0, 0, 10, 10, 8, 8, False, int(limit))
    with pytest.raises(RuntimeError, match="over the pixel limit"):
        torch.ops.fastpipe._jpeg_entropy_floor(data, 10, int(limit))


def test_one_setting_changes_the_limit_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "photo.jpg"
    path.write_bytes(_jpeg((64, 48)))
    assert jpeg.max_image_pixels() == Image.MAX_IMAGE_PIXELS  # the default follows PIL's limit...
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert jpeg.max_image_pixels() == 1000  # ...read on each call
    with pytest.raises(DecompressionBombError, match=r"64 = 3072 pixels, over the pixel limit of 1000"):
        jpeg.decode_jpeg_crop(path, (0, 0, 48, 64), (8, 8))
    jpeg.set_max_image_pixels(48 * 64)  # the one setting: now fastpipe's, whatever PIL's is
    assert jpeg.decode_jpeg_crop(path, (0, 0, 48, 64), (8, 8)).shape == (3, 8, 8)
    assert jpeg.jpeg_size(path) == (48, 64)
    jpeg.set_max_image_pixels(48 * 64 - 1)
    for call in (lambda: jpeg.jpeg_size(path), lambda: jpeg.decode_jpeg_crop(path, (0, 0, 8, 8), (8, 8))):
        with pytest.raises(DecompressionBombError, match="photo.jpg"):
            call()
    jpeg.set_max_image_pixels(None)
    assert jpeg.max_image_pixels() is None
    for bad in (0, -5, 2.5, True, "1000"):
        with pytest.raises(ConfigError, match="positive int, or None"):
            jpeg.set_max_image_pixels(bad)  # type: ignore[arg-type]


@requires_op
def test_without_a_limit_the_header_bomb_is_only_a_corrupt_file(header_bomb: Path) -> None:
    jpeg.set_max_image_pixels(None)
    assert jpeg.jpeg_size(header_bomb) == (60000, 60000)
    with pytest.raises(CorruptImageError) as info:  # 630 bytes hold no 60000x60000 image
        jpeg.decode_jpeg_crop(header_bomb, (0, 0, 16, 16), (8, 8))
    assert not isinstance(info.value, DecompressionBombError)


@requires_op
def test_output_size_over_the_limit_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "photo.jpg"
    path.write_bytes(_jpeg((64, 48)))
    jpeg.set_max_image_pixels(10_000)
    with pytest.raises(ConfigError, match=r"photo.jpg: output size \(200, 100\) is over the pixel limit of 10000"):
        jpeg.decode_jpeg_crop(path, (0, 0, 48, 64), (200, 100))
    with pytest.raises(RuntimeError, match="output size 200x100 is over the pixel limit"):
        torch.ops.fastpipe.decode_jpeg_crop(jpeg.read_bytes(path), 0, 0, 48, 64, 200, 100, False, 10_000)


@requires_op
def test_the_limit_sets_libjpegs_memory_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """libjpeg reads JPEGMEM into max_memory_to_use; the op overrides it from the limit, so the limit is what decides.

    A 512x512 4:4:4 progressive file keeps 1.5 MB of coefficients: over a 1 MB cap, libjpeg fails
    cleanly ("Backing store not supported") instead of allocating; under the cap the limit
    allows (16 bytes a pixel), it decodes.
    """
    data = jpeg.read_bytes(_jpeg((512, 512), progressive=True, subsampling=0, quality=90))
    monkeypatch.setenv("JPEGMEM", "1M")
    with pytest.raises(RuntimeError, match="Backing store not supported"):
        torch.ops.fastpipe.decode_jpeg_crop(data, 0, 0, 512, 512, 64, 64, False, None)  # no limit: JPEGMEM's cap stays
    with pytest.raises(RuntimeError, match="Backing store not supported"):
        torch.ops.fastpipe._jpeg_entropy_floor(data, 512, None)
    assert torch.ops.fastpipe.decode_jpeg_crop(data, 0, 0, 512, 512, 64, 64, False, 512 * 512).shape == (3, 64, 64)
    assert torch.ops.fastpipe._jpeg_entropy_floor(data, 512, 512 * 512) == 512
    jpeg.set_max_image_pixels(None)  # through the wrapper, the memory error is a DecompressionBombError naming the file
    with pytest.raises(DecompressionBombError, match=r"<image bytes>: .*Backing store not supported: decoding needs more memory"):
        jpeg.decode_jpeg_crop(data, (0, 0, 512, 512), (64, 64))


@requires_op
def test_huge_box_is_an_error_not_a_crash() -> None:
    """The box from the report that crashed the process (int64 overflow in the bounds check), in a child process."""
    code = (
        "import io, torch; from PIL import Image; import fastpipe.ops.jpeg as j\n"
        "b = io.BytesIO(); Image.new('RGB', (64, 48)).save(b, 'JPEG'); d = b.getvalue()\n"
        "for call in (lambda: j.decode_jpeg_crop(d, (2**62, 0, 2**62, 10), (8, 8)),\n"
        "             lambda: torch.ops.fastpipe.decode_jpeg_crop(j.read_bytes(d), 2**62, 0, 2**62, 10, 8, 8, False),\n"
        "             lambda: torch.ops.fastpipe.decode_jpeg_crop(j.read_bytes(d), 0, 2**63 - 5, 10, 10, 8, 8, False)):\n"
        "    try:\n"
        "        call(); print('returned')\n"
        "    except (ValueError, RuntimeError) as e:\n"
        "        print(type(e).__name__, str(e).splitlines()[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"exit code {out.returncode}: {out.stderr[-2000:]}"
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ConfigError") and "outside any image" in lines[0], lines
    assert all(line.startswith("RuntimeError") and "is not inside the 48x64 image" in line for line in lines[1:]), lines


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
@requires_op
def test_bombs_cost_under_20_mb_of_resident_memory(tmp_path: Path) -> None:
    """benchmarks/jpeg_bomb_rss.py in child processes: every reader refuses both bombs, each call growing the
    process by less than 20 MB; the unguarded control shows the meter sees the allocation the guard prevents."""
    bombs = load_benchmark("jpeg_bomb_rss")
    guarded, control = bombs.run(tmp_path, controls=("header",))  # the progressive control decodes 100 Mpixels: the script runs it
    print()
    for row in guarded + control:
        print(bombs.format_row(row))
    assert len(guarded) == 2 * len(bombs.OPS)
    for row in guarded:
        named = row["file"] if row["op"] != "DecodeCropOnDevice" else "file #0 of the batch"  # a batch holds bytes, no paths
        assert row["error"] and row["error"].startswith("DecompressionBombError") and named in row["error"], row
        assert row["growth_mb"] + row["blind_mb"] < bombs.GUARDED_LIMIT_MB, row
    # Without the limit the 630-byte file makes the op allocate its 1/8-scale rows: 7500 x 7500 x 4 bytes.
    assert control[0]["growth_mb"] > 100, control


@requires_op
def test_opcheck_with_the_limit_argument() -> None:
    """Schema, fake kernel and dispatch with max_pixels passed, as torch.library.opcheck sees them."""
    from torch.library import opcheck

    data = jpeg.read_bytes(_jpeg((120, 90)))
    opcheck(torch.ops.fastpipe.decode_jpeg_crop.default, (data, 3, 5, 80, 100, 32, 24, True, 120 * 90))
    opcheck(torch.ops.fastpipe.decode_jpeg_crop.default, (data, 0, 0, 90, 120, 16, 16, False, None))
