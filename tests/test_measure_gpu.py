"""Step times on CUDA are read with CUDA events, on the GPU's clock: the host only launches the steps.

Skipped without a GPU. The step is ``torch.cuda._sleep``, a kernel that spins a known number of
cycles: the host returns at once, so host-side intervals would time the launches (microseconds),
while the events time the kernels.
"""

from __future__ import annotations

import time

import pytest
import torch

from fastpipe.devices import parse_device
from fastpipe.diagnosis.ladder._measure import measure_steps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def cycles_for(seconds: float) -> int:
    """Calibrate torch.cuda._sleep: cycles that take ``seconds`` on this GPU."""
    probe = 50_000_000
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    return int(probe * seconds / (time.perf_counter() - start))


def test_cuda_step_times_are_gpu_time_not_launch_time() -> None:
    device = parse_device("cuda")
    cycles = cycles_for(0.02)
    launched = []

    def run_step(batch) -> None:
        began = time.perf_counter()
        torch.cuda._sleep(cycles)  # 20 ms of GPU time, launched asynchronously
        launched.append(time.perf_counter() - began)

    measurement = measure_steps(lambda: None, run_step, warmup=2, steps=10, device=device)
    assert max(launched) < 0.005  # the host only launched
    assert measurement.mean_step_s == pytest.approx(0.02, rel=0.25)
    assert min(measurement.step_times) > 0.01  # every step, not only the last, is read on the GPU's clock
