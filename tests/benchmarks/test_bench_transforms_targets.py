"""benchmarks/bench_transforms.py: a target that could not be measured fails the run unless --allow-missing.

Timings are faked (rows meeting every target); only the baseline-ISA subprocess's outcome changes.
"""

from __future__ import annotations

import subprocess
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.fakes.benchmark_scripts import load_benchmark


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_benchmark("bench_transforms")
    Row = module.Row
    monkeypatch.setattr(
        module,
        "per_op_rows",
        lambda rounds: [
            Row("per op, one 256x256 sample", "RandomMask numba", 0.1, "ms", 30.0),
            Row("per op, one 256x256 sample", "RandomMask cpp", 0.1, "ms", 40.0),
        ],
    )
    monkeypatch.setattr(
        module,
        "worker_rows",
        lambda rounds, batch: [
            Row("per-sample worker cost (batch of 32, incl. collate)", "toy:fast-raw (1024x1024 raw)", 1.0, "ms", 12.0),
            Row("per-sample worker cost (batch of 32, incl. collate)", "toy:optimized (crop-first)", 0.5, "ms", 25.0),
        ],
    )
    monkeypatch.setattr(
        module,
        "h2d_rows",
        lambda: [Row("host-to-device payload per batch of 256", "toy:optimized (torch.uint8, labels torch.int64)", 12.0, "MiB", 3.999)],
    )
    monkeypatch.setattr(module, "backend_available", lambda backend: True)
    return module


def subprocess_run(returncode: int, stdout: str = "", stderr: str = "") -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(returncode=returncode, stdout=stdout, stderr=stderr)

    return run


def test_every_target_measured_and_met_passes(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subprocess, "run", subprocess_run(0, stdout='{"naive": 0.003, "numba": 0.0001}\n'))
    assert bench.main(["--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "PASS  RandomMask numba >= 20x faster than naive, compiled for the x86-64 baseline ISA: 30.0x" in out
    assert "NOT MEASURED" not in out


def test_a_failed_baseline_isa_subprocess_fails_the_run_and_says_why(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subprocess, "run", subprocess_run(1, stderr="Traceback...\nLLVM ERROR: no such CPU 'generic'"))
    assert bench.main(["--rounds", "1"]) == 1
    out = capsys.readouterr().out
    assert (
        "NOT MEASURED: RandomMask numba >= 20x faster than naive, compiled for the x86-64 baseline ISA: "
        "the baseline-ISA subprocess exited 1: LLVM ERROR: no such CPU 'generic'"
    ) in out


def test_allow_missing_lets_a_target_not_measured_pass_but_not_a_missed_one(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subprocess, "run", subprocess_run(0, stdout="garbage"))
    assert bench.main(["--rounds", "1", "--allow-missing"]) == 0
    out = capsys.readouterr().out
    assert (
        "NOT MEASURED: RandomMask numba >= 20x faster than naive, compiled for the x86-64 baseline ISA: "
        "the baseline-ISA subprocess printed no timings"
        in out
        and "do not decide the exit status" in out
    )
    # a measured target that falls short still fails, --allow-missing or not
    monkeypatch.setattr(subprocess, "run", subprocess_run(0, stdout='{"naive": 0.003, "numba": 0.001}\n'))
    assert bench.main(["--rounds", "1", "--allow-missing"]) == 1


def test_a_backend_not_built_is_not_measured(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(subprocess, "run", subprocess_run(0, stdout='{"naive": 0.003, "numba": 0.0001}\n'))
    monkeypatch.setattr(bench, "per_op_rows", lambda rounds: [bench.Row("per op, one 256x256 sample", "RandomMask numba", 0.1, "ms", 30.0)])
    assert bench.main(["--rounds", "1"]) == 1
    assert "NOT MEASURED: RandomMask cpp >= 20x faster than naive (256x256): the cpp backend is not available" in capsys.readouterr().out
