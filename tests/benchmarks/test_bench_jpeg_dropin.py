"""benchmarks/bench_jpeg.py --dropin: the agreement it prints (same boxes, pixels within tolerance) is measured and can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastpipe.ops.jpeg as jpeg
from tests.fakes.benchmark_scripts import load_benchmark

pytestmark = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four smooth 500x375 JPEGs (gradients and waves, a little noise) in two class folders: photo-like enough for the
    op's tolerance, and quick to make."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("dropin") / "corpus"
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    for i in range(4):
        base = np.stack([x * (0.3 + i / 10), y * 0.5, 128 + 80 * np.sin(x / (9 + i)) * np.cos(y / 13.0)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)
        folder = root / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels if i % 2 else pixels.transpose(1, 0, 2).copy()).save(folder / f"{i}.jpg", quality=90)
    return root


def run(corpus: Path, out: Path) -> int:
    return load_benchmark("bench_jpeg").main(["--dropin", "--root", str(corpus), "--n", "4", "--rounds", "1", "--out", str(out)])


def test_dropin_table_compares_boxes_pixels_and_costs(corpus: Path, tmp_path: Path) -> None:
    assert run(corpus, tmp_path) == 0
    result = json.loads((tmp_path / "bench_jpeg_dropin.json").read_text())["recipes"]
    assert result["train"]["boxes_compared"] == result["train"]["boxes_equal"] == 4
    assert result["val"]["boxes_compared"] == 0 and "Resize + CenterCrop" in result["val"]["fast_path"]
    for recipe in result.values():
        assert recipe["torchvision_ms"] > 0 and recipe["fastpipe_ms"] > 0 and recipe["within_tolerance"]
    assert "| train |" in (tmp_path / "bench_jpeg_dropin.md").read_text()


def test_dropin_fails_when_fastpipe_draws_other_boxes(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fastpipe.datasets.crop as crop

    real = crop.crop_params

    def shifted(height: int, width: int, scale, ratio):
        top, left, h, w = real(height, width, scale, ratio)
        return (0, 0, h, w) if (top, left) != (0, 0) else (height - h, width - w, h, w)

    monkeypatch.setattr(crop, "crop_params", shifted)
    assert run(corpus, tmp_path) == 1
    train = json.loads((tmp_path / "bench_jpeg_dropin.json").read_text())["recipes"]["train"]
    assert train["boxes_equal"] < train["boxes_compared"]
