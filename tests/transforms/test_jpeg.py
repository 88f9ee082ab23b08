"""JPEG decoding at reduced DCT scale when the crop allows it."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from fastpipe.errors import ConfigError
from fastpipe.transforms.jpeg import JpegRandomResizedCrop, dct_scale_for, decode_jpeg_reduced, decode_pil_draft_crop

SIZE = (640, 480)  # width, height


@pytest.fixture
def jpeg_path(tmp_path: Path) -> Path:
    """A smooth colour pattern (JPEG's and downscaling's friendly case) with some texture, written by PIL."""
    y, x = np.mgrid[0 : SIZE[1], 0 : SIZE[0]]
    pixels = np.stack([(x / 3) % 256, (y / 2) % 256, 128 + 60 * np.sin(x / 23.0) * np.cos(y / 17.0)], axis=-1).astype(np.uint8)
    path = tmp_path / "pattern.jpg"
    Image.fromarray(pixels).save(path, "JPEG", quality=92)
    return path


def full_decode(path: Path, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB").resize(size, Image.BILINEAR, box=box), dtype=np.float64)


@pytest.fixture
def drafts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Records the sizes the decoder was asked for, so tests see whether reduced decoding happened."""
    from PIL import JpegImagePlugin

    asked: list[tuple[int, int]] = []
    original = JpegImagePlugin.JpegImageFile.draft

    def spy(self: Image.Image, mode: str | None, size: tuple[int, int] | None):  # type: ignore[no-untyped-def]
        asked.append(size)
        return original(self, mode, size)

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    return asked


def test_dct_scale_for() -> None:
    assert dct_scale_for((0, 0, 640, 480), (224, 224)) == 2
    assert dct_scale_for((0, 0, 640, 480), (80, 60)) == 8
    assert dct_scale_for((10, 10, 250, 250), (224, 224)) == 1
    assert dct_scale_for((0, 0, 200, 460), (50, 224)) == 2  # the tighter side decides


def test_large_box_decodes_at_reduced_scale_and_matches_full_decode(jpeg_path: Path, drafts: list) -> None:
    box, size = (40, 20, 600, 460), (128, 96)
    out = decode_pil_draft_crop(jpeg_path, box, size)
    assert out.size == size and out.mode == "RGB"
    assert drafts == [(SIZE[0] // 4, SIZE[1] // 4)]  # 560x440 box -> 128x96 output allows 1/4 scale
    difference = np.abs(np.asarray(out, dtype=np.float64) - full_decode(jpeg_path, box, size))
    assert difference.mean() < 3.0 and np.percentile(difference, 99) < 24  # DCT-domain vs pixel-domain downscaling


def test_small_box_decodes_at_full_size_exactly(jpeg_path: Path, drafts: list) -> None:
    box, size = (100, 100, 300, 260), (200, 160)
    out = decode_pil_draft_crop(jpeg_path, box, size)
    assert drafts == []  # no reduction possible: the decoder was not touched
    assert np.array_equal(np.asarray(out, dtype=np.float64), full_decode(jpeg_path, box, size))


def test_decode_reduced_keeps_the_shorter_side(jpeg_path: Path) -> None:
    out = decode_jpeg_reduced(jpeg_path, 200)
    assert out.size == (320, 240) and out.mode == "RGB"
    assert decode_jpeg_reduced(jpeg_path, 300).size == SIZE  # 1/2 would give 240 < 300


def test_random_resized_crop_loader(jpeg_path: Path) -> None:
    loader = JpegRandomResizedCrop(96)
    torch.manual_seed(0)
    out = loader(jpeg_path)
    assert out.size == (96, 96) and out.mode == "RGB"
    torch.manual_seed(0)
    top, left, height, width = T.RandomResizedCrop.get_params(torch.empty(3, SIZE[1], SIZE[0]), [0.08, 1.0], [3 / 4, 4 / 3])
    torch.manual_seed(0)
    assert loader.box(SIZE) == (left, top, left + width, top + height)  # torchvision's own distribution of boxes
    with open(jpeg_path, "rb") as fh:
        assert loader(io.BytesIO(fh.read())).size == (96, 96)


def test_non_jpeg_files_decode_at_full_size(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    Image.fromarray(np.full((64, 80, 3), 90, dtype=np.uint8)).save(path)
    out = decode_pil_draft_crop(path, (0, 0, 80, 64), (20, 16))
    assert out.size == (20, 16) and np.asarray(out).max() == 90


def test_bad_boxes_and_sizes(jpeg_path: Path) -> None:
    with pytest.raises(ConfigError, match="not inside"):
        decode_pil_draft_crop(jpeg_path, (0, 0, 700, 100), (10, 10))
    with pytest.raises(ConfigError, match="positive"):
        decode_pil_draft_crop(jpeg_path, (0, 0, 100, 100), (0, 10))
    with pytest.raises(ConfigError, match="positive"):
        decode_jpeg_reduced(jpeg_path, 0)
