"""tests/fakes/gpu_clock.py's calibration, without a GPU: the probe is replaced by a clock that ramps up as a GPU's does."""

from __future__ import annotations

import itertools

import pytest

from tests.fakes import gpu_clock

IDLE_HZ, BUSY_HZ = 345e6, 1980e6  # an H200's SM clock, idle and under load


def ramping_probe(monkeypatch: pytest.MonkeyPatch, idle_probes: int) -> list[float]:
    """The probe lasts PROBE_CYCLES at the idle clock for ``idle_probes`` calls, then at the busy clock."""
    seen: list[float] = []

    def probe(cycles: int = gpu_clock.PROBE_CYCLES) -> float:
        seconds = cycles / (IDLE_HZ if len(seen) < idle_probes else BUSY_HZ)
        seen.append(seconds)
        return seconds

    monkeypatch.setattr(gpu_clock, "_probe_s", probe)
    return seen


def test_the_count_is_calibrated_at_the_clock_it_will_run_at(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = ramping_probe(monkeypatch, idle_probes=3)
    cycles = gpu_clock.sleep_cycles(20.0)
    assert cycles / BUSY_HZ == pytest.approx(0.020, rel=1e-3), "20 ms at the clock the sleep runs at"
    assert seen[0] == pytest.approx(gpu_clock.PROBE_CYCLES / IDLE_HZ) and len(seen) >= 5


def test_control_a_count_calibrated_idle_runs_a_sixth_as_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the first GPU run did: one probe on the idle GPU, then the sleep at full clock (its 10.9 ms for 20)."""
    ramping_probe(monkeypatch, idle_probes=1)
    idle_cycles = int(gpu_clock.PROBE_CYCLES * 0.020 / gpu_clock._probe_s())
    assert idle_cycles / BUSY_HZ < 0.005


def test_a_clock_that_never_settles_stops_at_max_s(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = itertools.count(1)
    monkeypatch.setattr(gpu_clock, "_probe_s", lambda cycles=0: 0.001 * next(calls))  # every probe 1 ms longer
    assert gpu_clock.warm_up(min_s=0.0, max_s=0.05, agree=0.0) > 0
