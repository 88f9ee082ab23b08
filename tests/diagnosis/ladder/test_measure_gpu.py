"""Step times on CUDA are read with CUDA events, on the GPU's clock: the host only launches the steps.

Skipped without a GPU. The step is ``torch.cuda._sleep``, a kernel that spins a number of cycles: the host
returns at once, so host-side intervals would time the launches (microseconds), while the events time the
kernels. The reference is CUDA events recorded around each step's own kernel, on a warmed-up GPU
(:mod:`tests.fakes.gpu_clock`): a cycle count calibrated earlier lasts what the clock of the moment makes it
(the first GPU run's 10.9 ms for a "20 ms" sleep, calibrated on an idle H200).
"""

from __future__ import annotations

import time

import pytest
import torch

from fastpipe.devices import parse_device
from fastpipe.diagnosis.ladder._measure import measure_steps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

WARMUP, STEPS = 3, 10


def test_cuda_step_times_are_gpu_time_not_launch_time() -> None:
    from tests.fakes.gpu_clock import sleep_cycles

    device = parse_device("cuda")
    cycles = sleep_cycles(20.0)  # about 20 ms; what it really lasts is read below, around each kernel
    launched: list[float] = []
    kernels: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def run_step(batch) -> None:
        began = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)  # launched asynchronously
        end.record()
        kernels.append((start, end))
        launched.append(time.perf_counter() - began)

    measurement = measure_steps(lambda: None, run_step, warmup=WARMUP, steps=STEPS, device=device)
    torch.cuda.synchronize()
    kernel_s = [start.elapsed_time(end) / 1000.0 for start, end in kernels[WARMUP:]]
    assert len(measurement.step_times) == len(kernel_s) == STEPS
    assert max(launched) < 0.005, "the host only launched"
    assert min(kernel_s) > 4 * max(launched), f"the kernels ({min(kernel_s) * 1e3:.1f} ms) must outlast a launch by far"
    # The host runs ahead, so the GPU runs the steps back to back: each step's time is its own kernel's.
    for measured, kernel in zip(measurement.step_times, kernel_s):
        assert measured == pytest.approx(kernel, rel=0.05, abs=2e-4)
    assert measurement.mean_step_s == pytest.approx(sum(kernel_s) / STEPS, rel=0.05)
