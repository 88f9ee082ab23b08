"""benchmarks/thread_loaders.py: the issue-25 targets come from the ratios measured in the run, and a miss fails.

Timings are planted (each loader's epoch and each one-thread row return fixed seconds), so the test checks the
arithmetic and the verdicts, never the machine's speed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.fakes.benchmark_scripts import BENCHMARKS, load_benchmark

#: seconds per epoch (of the file list) or per pass, by row name prefix.
PLANTED = {
    "thread-loader (1 thread)": 2.0,
    "thread-loader (2 threads)": 1.0,
    "dataloader+fastpipe (2 workers)": 1.5,
    "torchvision-v2 (2 workers)": 3.0,
    "op alone (1 thread)": 1.4,  # thread CPU: not what the 85% target divides by
    "op alone (1 thread, wall)": 1.6,
    "fastpipe sample (1 thread)": 1.7,
    "entropy floor (1 thread)": 1.0,
    "fastpipe sample, portable resize (1 thread)": 1.9,
    "fastpipe sample, resize skipped (1 thread)": 1.5,
}


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = load_benchmark("thread_loaders")
    monkeypatch.setattr(module, "make_loader", lambda kind, files, batch: kind)
    names = iter(PLANTED)

    def planted(name: str):
        return lambda: PLANTED[name]

    monkeypatch.setattr(module, "epoch_of", lambda loader: planted(next(names)))
    monkeypatch.setattr(
        module,
        "op_alone",
        lambda files, clock=time.thread_time: planted("op alone (1 thread)" if clock is time.thread_time else "op alone (1 thread, wall)"),
    )
    monkeypatch.setattr(module, "prepared_variants", lambda files: ({}, 0))
    rows = iter([name for name in PLANTED if name.startswith(("fastpipe sample", "entropy floor"))])  # in the script's order
    monkeypatch.setattr(module, "per_sample", lambda fn, files: planted(next(rows)))
    monkeypatch.setattr(
        module, "pss_of", lambda kind, files, batch: ({"thread-loader-2": 100.0, "dataloader-fastpipe": 300.0}.get(kind, 200.0), "ok", 10.0)
    )
    monkeypatch.setattr(module, "spdl_epoch", lambda files, threads: (None, "not installed"))
    yield module
    sys.modules.pop("bench_jpeg", None)


def test_targets_are_the_measured_ratios_and_misses_fail(bench) -> None:
    files = [Path(f"/nonexistent/{i}.jpg") for i in range(100)]
    lines, targets, payload = bench.thread_section(files, rounds=2, batch=10)

    def find(prefix: str) -> tuple[float, str]:
        return next((value, verdict) for name, value, verdict in targets if name.startswith(prefix))

    value, verdict = find("images/s: thread loader (2 threads) / DataLoader")
    assert value == pytest.approx(1.5) and verdict == "PASS"
    value, verdict = find("images/s: thread loader (2 threads) / (2 /")
    # the op's wall time (1.6 s per 100 files), measured as the loaders are: 0.8 < 0.85
    assert value == pytest.approx((100 / 1.0) / (2 / (1.6 * 1e3 / 100 / 1e3))) and verdict.startswith("FAIL")
    assert any(line.startswith("85% target:") and "(0.80)" in line for line in lines), "the run says what limits it"
    value, verdict = find("PSS:")
    assert value == pytest.approx(1 / 3) and verdict == "PASS", "the target divides by the DataLoader as this Python starts it"
    forkserver = [line for line in lines if line.startswith("PSS with the DataLoader's workers started by forkserver")]
    assert len(forkserver) == 1 and "/ this DataLoader 0.50x" in forkserver[0], "forkserver's row is planted at 200 MiB"
    value, verdict = find("cost: fastpipe sample")
    assert value == pytest.approx(1.7) and verdict.startswith("FAIL")
    assert find("images/s: thread loader (2 threads) / DALI")[1].startswith("NOT MEASURED")  # DALI absent here
    assert any("spdl (2 threads) | not installed" in line for line in lines)
    assert payload["images_per_s"]["thread-loader (2 threads)"] == pytest.approx(100.0)
