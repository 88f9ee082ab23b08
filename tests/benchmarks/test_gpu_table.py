"""benchmarks/gpu_table.py: the GPU check's table and utilisation sampler, fed with files written here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.fakes.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def gpu_table() -> ModuleType:
    return load_benchmark("gpu_table")


def diagnosis(bound: float, experiments: list[dict[str, Any]], verdict: str = "input-bound") -> dict[str, Any]:
    """The shape ``fastpipe diagnose --json`` writes (only the keys the table reads, plus the rest empty)."""
    return {"device_bound_steps_per_s": bound, "experiments": experiments, "bottlenecks": [], "verdict": verdict, "caveats": []}


def experiment(name: str, cache_point: str | None, steps_per_s: float, fraction: float | None) -> dict[str, Any]:
    return {
        "name": name,
        "cache_point": cache_point,
        "steps_per_s": steps_per_s,
        "fraction_of_bound": fraction,
        "spread": 0.02,
        "cpu_util": 0.9,
    }


def write(path: Path, data: dict[str, Any]) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_table_reads_the_baseline_and_utilisation(gpu_table: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    naive = write(
        tmp_path / "naive.json",
        diagnosis(
            3.45,
            [experiment("after:RandomMask", "after:RandomMask", 2.9, 0.84), experiment("baseline", None, 0.69, 0.2)],
            "CPU-bound in RandomMask",
        ),
    )
    naive_util = write(tmp_path / "u1.json", {"returncode": 0, "wall_s": 80.0, "source": "nvidia-smi", "samples": [10.0, 30.0, 20.0]})
    optimized = write(tmp_path / "opt.json", diagnosis(3.45, [experiment("baseline", None, 3.3, float("nan"))], "device-bound"))
    summary = tmp_path / "summary.json"
    argv = [
        "table",
        "--device",
        "cuda",
        "--run",
        f"toy:naive={naive},{naive_util}",
        "--run",
        f"toy:optimized={optimized}",
        "--json",
        str(summary),
    ]
    assert gpu_table.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    naive_line = next(line for line in lines if line.startswith("toy:naive "))
    assert naive_line.split()[1:] == ["0.69", "3.45", "20", "20", "%", "30", "%", "ok"]
    optimized_line = next(line for line in lines if line.startswith("toy:optimized "))
    assert optimized_line.split()[1:4] == ["3.30", "3.45", "96"]  # % computed when the report could not give it (NaN)
    assert optimized_line.split()[4:6] == ["n/a", "n/a"]
    assert "toy:naive: CPU-bound in RandomMask" in lines
    assert not any("dry run" in line for line in lines)
    rows = json.loads(summary.read_text())["rows"]
    assert rows[0]["gpu_util_mean"] == pytest.approx(20.0) and rows[0]["gpu_util_source"] == "nvidia-smi"
    assert rows[1]["pct_of_bound"] == pytest.approx(100 * 3.3 / 3.45)


def test_missing_results_say_why(gpu_table: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    timed_out = write(tmp_path / "u1.json", {"returncode": 124, "wall_s": 110.2, "source": "n/a", "samples": []})
    failed = write(tmp_path / "u2.json", {"returncode": 2, "wall_s": 3.0, "source": "n/a", "samples": []})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    argv = [
        "table",
        "--device",
        "sim:290",
        "--run",
        f"a={tmp_path / 'none.json'},{timed_out}",
        "--run",
        f"b={broken},{failed}",
        "--run",
        "c=/nowhere",
    ]
    assert gpu_table.main(argv) == 0
    out = capsys.readouterr().out
    assert "timed out after 110 s" in out
    assert "failed (exit 2), no JSON" in out
    assert "not run" in out
    assert "sim:290 is not a GPU: this is a dry run, and the GPU table still awaits a GPU." in out


def test_baseline_falls_back_to_the_uncached_experiment(gpu_table: ModuleType) -> None:
    runs = [experiment("cached", "after:load", 3.0, 0.9), experiment("as-is", None, 1.0, 0.3)]
    assert gpu_table.baseline(diagnosis(3.3, runs))["name"] == "as-is"
    assert gpu_table.baseline(diagnosis(3.3, runs[:1]))["name"] == "cached"
    assert gpu_table.baseline(diagnosis(3.3, [])) is None


def test_sampler_samples_while_the_command_runs_and_keeps_its_exit_status(gpu_table: ModuleType) -> None:
    command = [sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"]
    returncode, samples, wall_s = gpu_table.sample_while(command, lambda: 42.0, interval_s=0.05)
    assert returncode == 3
    assert wall_s >= 0.5
    assert len(samples) >= 3 and set(samples) == {42.0}
    assert gpu_table.sample_while([sys.executable, "-c", "pass"], None, interval_s=0.05)[:2] == (0, [])


def test_nvml_index_follows_cuda_visible_devices(gpu_table: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [gpu_table.nvml_index(0), gpu_table.nvml_index(1)] == [3, 1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_table.nvml_index(2) == 2
