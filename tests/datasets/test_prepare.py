"""prepare_folder / to_baseline: progressive JPEGs rewritten as baseline with the very same pixels; the rest linked."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastpipe.ops.jpeg as jpeg
from fastpipe.datasets.prepare import prepare_folder, to_baseline
from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError
from fastpipe.ops.jpeg import is_progressive

requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 0.6, y * 0.5, 128 + 90 * np.sin(x / 13.0) * np.cos(y / 9.0)], axis=-1)
    return np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)


def _jpeg(array: np.ndarray, **options: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "JPEG", **options)
    return buf.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@requires_op
@pytest.mark.parametrize(
    "options", [dict(quality=85, progressive=True), dict(quality=95, progressive=True, subsampling=0), dict(quality=70, progressive=True)]
)
def test_pixels_identical_bit_for_bit(options: dict) -> None:
    original = _jpeg(_photo(203, 311, 1), **options)
    assert is_progressive(torch.frombuffer(bytearray(original), dtype=torch.uint8))
    rewritten = to_baseline(torch.frombuffer(bytearray(original), dtype=torch.uint8))
    assert not is_progressive(rewritten)
    out = rewritten.numpy().tobytes()
    assert np.array_equal(_pixels(original), _pixels(out))  # libjpeg's full decode, through PIL
    box = (11, 17, 150, 200)
    assert torch.equal(jpeg.decode_jpeg_crop(original, box, (64, 64)), jpeg.decode_jpeg_crop(out, box, (64, 64)))
    with_markers = to_baseline(torch.frombuffer(bytearray(original), dtype=torch.uint8), restart_rows=1).numpy().tobytes()
    assert b"\xff\xdd" in with_markers and np.array_equal(_pixels(original), _pixels(with_markers))  # DRI present, same pixels


@requires_op
def test_greyscale_and_exif_survive() -> None:
    grey = Image.fromarray(_photo(120, 160, 2)[..., 0])
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x010F] = "fastpipe-test"  # Make
    grey.save(buf, "JPEG", quality=90, progressive=True, exif=exif)
    rewritten = to_baseline(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)).numpy().tobytes()
    assert np.array_equal(_pixels(buf.getvalue()), _pixels(rewritten))
    assert Image.open(io.BytesIO(rewritten)).getexif()[0x010F] == "fastpipe-test"


@requires_op
def test_prepare_folder_rewrites_progressive_links_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for k in range(6):
        folder = source / f"class_{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k}.jpg").write_bytes(_jpeg(_photo(240, 320, k), quality=85, progressive=k % 2 == 0))
    (source / "class_0" / "notes.txt").write_text("not an image")
    (source / "class_1" / "broken.jpg").write_bytes(_jpeg(_photo(64, 64, 9), progressive=True)[:200])
    report = prepare_folder(source, tmp_path / "dst", size=64, sample=2)
    assert (report.files, report.changed, report.linked + report.copied) == (8, 3, 5)
    rewritten = [p for p in source.rglob("*.jpg") if p.name != "broken.jpg" and int(p.stem) % 2 == 0]
    assert report.bytes_before == sum(p.stat().st_size for p in rewritten), "every rewritten file counted"
    assert report.timed == 2, "only a bounded sample is kept in memory and timed"
    assert report.ms_before is not None and report.ms_after is not None and "3 of 8 files rewritten" in report.summary()
    for path in source.rglob("*.jpg"):
        if path.name == "broken.jpg":
            continue
        out = tmp_path / "dst" / path.relative_to(source)
        assert np.array_equal(_pixels(path.read_bytes()), _pixels(out.read_bytes()))
    assert (tmp_path / "dst" / "class_0" / "notes.txt").read_text() == "not an image"
    with pytest.raises(ConfigError, match="not empty"):
        prepare_folder(source, tmp_path / "dst")


@requires_op
def test_corrupt_input_is_an_error() -> None:
    with pytest.raises(CorruptImageError):
        to_baseline(torch.frombuffer(bytearray(_jpeg(_photo(64, 64, 3), progressive=True)[:150]), dtype=torch.uint8))


@requires_op
def test_cli_prepare_reports_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastpipe.cli import main

    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "0.jpg").write_bytes(_jpeg(_photo(100, 120, 4), progressive=True))
    (tmp_path / "src" / "a" / "1.jpg").write_bytes(_jpeg(_photo(100, 120, 5)))
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "dst")]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 files rewritten" in out and "ms per image" in out


@requires_op
def test_the_pixel_limit_applies_before_libjpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpeg, "_max_pixels_setting", 1000)
    with pytest.raises(DecompressionBombError, match="pixel limit"):
        to_baseline(torch.frombuffer(bytearray(_jpeg(_photo(64, 64, 3), progressive=True)), dtype=torch.uint8))
