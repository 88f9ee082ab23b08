"""benchmarks/bench_jpeg_resize.py runs end to end on three small JPEGs, prints every figure, and leaves the op's
resize kernel as it found it (never a test of its timings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fastpipe.ops.jpeg as jpeg
from tests.fakes.benchmark_scripts import load_benchmark

pytestmark = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


def test_runs_and_restores_the_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(tmp_path / f"{i}.jpg", quality=90)
    before = torch.ops.fastpipe._jpeg_set_resize_kernel("portable")
    try:
        assert load_benchmark("bench_jpeg_resize").main(["--root", str(tmp_path), "--n", "3", "--rounds", "1", "--size", "32"]) == 0
        assert torch.ops.fastpipe._jpeg_set_resize_kernel(before) == "portable"
    finally:
        torch.ops.fastpipe._jpeg_set_resize_kernel(before)
    out = capsys.readouterr().out
    for line in ("resize cost: portable", "resize speed-up, dispatched vs portable", "resize share of the op", "op / entropy floor"):
        assert line in out
