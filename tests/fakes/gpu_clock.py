"""GPU busy-waits for the GPU tests, timed against CUDA events on a warmed-up GPU.

``torch.cuda._sleep(cycles)`` spins a number of SM clock cycles, so what it lasts depends on the clock at the
moment it runs: an idle H200 reads 345 MHz and 1980 MHz under load. A count calibrated on an idle GPU and
run on a busy one lasts a sixth of what was meant (the first GPU run measured 10.9 ms for a "20 ms" sleep).
So the GPU is kept busy first, until two consecutive probes agree, the count is calibrated with CUDA
events right after, and tests that time anything compare with CUDA events recorded around the very
kernels they time, never with the calibration's figure.
"""

from __future__ import annotations

import time

import torch

PROBE_CYCLES = 5_000_000


def _probe_s(cycles: int = PROBE_CYCLES) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def warm_up(min_s: float = 0.3, max_s: float = 3.0, agree: float = 0.05) -> float:
    """Keep the GPU busy at least ``min_s`` and until two probes in a row agree within ``agree``; returns a probe's seconds."""
    began = time.perf_counter()
    last = _probe_s()
    while True:
        now = _probe_s()
        settled = abs(now - last) <= agree * last
        last = now
        if (settled and time.perf_counter() - began >= min_s) or time.perf_counter() - began >= max_s:
            return now


def sleep_cycles(ms: float) -> int:
    """Cycles for ``torch.cuda._sleep`` to last about ``ms`` on the warmed-up GPU (calibrated with CUDA events)."""
    per_probe_s = warm_up()
    return max(1, int(PROBE_CYCLES * ms / 1000.0 / max(per_probe_s, 1e-6)))
