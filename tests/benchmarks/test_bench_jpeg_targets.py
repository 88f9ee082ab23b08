"""benchmarks/bench_jpeg.py: a target that could not be measured (DALI absent) fails the run unless --allow-missing.

The script runs end to end on three small JPEGs; the timed rounds are faked with planted costs
that meet every measured target, so only whether DALI ran decides.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.fakes.benchmark_scripts import load_benchmark

#: ms per image planted for each candidate: the PIL recipe 5x fastpipe's cost, torchvision 3x, DALI 3x.
PLANTED = {"fastpipe": 1.0, "fastpipe-wall": 1.0, "pil-recipe": 5.0, "torchvision-v2": 3.0, "entropy-floor": 0.5, "dali-cpu": 3.0}


@pytest.fixture()
def jpegs(tmp_path: Path) -> Path:
    from PIL import Image

    folder = tmp_path / "jpegs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=90)
    return folder


def bench_with(monkeypatch: pytest.MonkeyPatch, dali: bool) -> ModuleType:
    bench = load_benchmark("bench_jpeg")

    def time_rounds(rows: dict[str, Any], fns: dict[str, Any], rounds: int, n_images: int) -> dict[str, list[list[float]]]:
        per_file = {}
        for name in fns:
            ms = PLANTED.get(name.split(" (")[0], 1.0)
            rows[name].per_round_ms = [ms] * rounds
            per_file[name] = [[ms / 1e3] * n_images for _ in range(rounds)]
        return per_file

    def dali_epoch(files: list[Path], threads: int, batch: int) -> Any:
        return (lambda: 0.0, "ok") if dali else (None, "not installed (pip install 'fastpipe[dali]', i.e. nvidia-dali-cuda120)")

    monkeypatch.setattr(bench, "time_rounds", time_rounds)
    monkeypatch.setattr(bench, "dali_epoch", dali_epoch)
    monkeypatch.setattr(bench, "loader_epoch", lambda files, fn, workers, batch: lambda: 0.0)
    for peer in ("simplejpeg_candidate", "spdl_candidate"):
        monkeypatch.setattr(bench, peer, lambda: ("a peer", None, "not installed (faked)"))
    return bench


def run(bench: ModuleType, jpegs: Path, tmp_path: Path, *extra: str) -> int:
    return bench.main(["--root", str(jpegs), "--n", "3", "--rounds", "1", "--workers", "1", "--out", str(tmp_path / "out"), *extra])


def test_dali_absent_is_not_measured_and_fails_the_run(
    jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_with(monkeypatch, dali=False)
    assert run(bench, jpegs, tmp_path) == 1
    out = capsys.readouterr().out
    assert "NOT MEASURED: images/s, 1 thread: fastpipe / DALI CPU >= 2x (wall): DALI CPU not installed" in out
    assert "NOT MEASURED: images/s, DataLoader workers / DALI threads: fastpipe / DALI CPU >= 2x: DALI CPU not installed" in out
    assert "| cost: usual PIL recipe / fastpipe >= 4x | 5.00x | PASS |" in out


def test_dali_absent_passes_with_allow_missing(
    jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_with(monkeypatch, dali=False)
    assert run(bench, jpegs, tmp_path, "--allow-missing") == 0
    assert "2 target(s) not measured; --allow-missing" in capsys.readouterr().out


def test_with_dali_every_target_is_measured(
    jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = bench_with(monkeypatch, dali=True)
    assert run(bench, jpegs, tmp_path) == 0
    out = capsys.readouterr().out
    assert "NOT MEASURED" not in out and "| images/s, 1 thread: fastpipe / DALI CPU >= 2x (wall) | 3.00x | PASS |" in out


def test_a_measured_miss_fails_even_with_allow_missing(jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = bench_with(monkeypatch, dali=False)
    monkeypatch.setitem(PLANTED, "pil-recipe", 2.0)  # 2x, short of the 4x target
    assert run(bench, jpegs, tmp_path, "--allow-missing") == 1
