"""benchmarks/bench_jpeg.py --dropin: the agreement it prints (same boxes, pixels within tolerance) is measured and can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastpipe.ops.jpeg as jpeg
from tests.benchmark_scripts import load_benchmark

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
pytestmark = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=4, seed=0, classes=2)


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
