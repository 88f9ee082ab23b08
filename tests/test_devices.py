import time

import pytest
import torch

from fastpipe.devices import CpuDevice, SimDevice, default_device_spec, parse_device
from fastpipe.errors import ConfigError, DeviceUnavailableError


@pytest.mark.parametrize(
    "spec, step_ms, gbps",
    [("sim:290", 290, 12), ("sim:50,h2d_gbps=3", 50, 3), ("sim:0.5", 0.5, 12)],
)
def test_parse_sim(spec: str, step_ms: float, gbps: float) -> None:
    device = parse_device(spec)
    assert isinstance(device, SimDevice)
    assert device.step_ms == pytest.approx(step_ms)
    assert device.h2d_bytes_per_s == pytest.approx(gbps * 1e9)


@pytest.mark.parametrize("spec", ["sim:abc", "sim:", "sim:-5", "sim:10,h2d_gbps=0", "sim:10,bw=3", "simulator", "tpu", "cuda:x"])
def test_bad_specs_say_how_to_fix(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"e\.g\. --device"):
        parse_device(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(DeviceUnavailableError, match="--device cpu"):
        parse_device("cuda")


def test_default_device() -> None:
    expected = "cuda" if torch.cuda.is_available() else "sim:290"
    assert default_device_spec() == expected
    assert parse_device(None).spec == expected


def test_cpu_device_runs_the_step() -> None:
    calls = []
    device = parse_device("cpu")
    assert isinstance(device, CpuDevice) and device.runs_model
    device.run_step(calls.append, "batch")
    assert calls == ["batch"]


def test_sim_steps_take_wall_time_but_no_cpu() -> None:
    device = parse_device("sim:50")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(5):
        device.run_step(lambda batch: pytest.fail("sim must not run the step"), None)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert wall >= 0.250
    assert cpu < 0.05


def test_pageable_copy_blocks_for_bytes_over_bandwidth() -> None:
    device = parse_device("sim:10,h2d_gbps=1")
    batch = torch.zeros(25_000_000, dtype=torch.uint8)  # 25 MB at 1 GB/s: 25 ms
    start = time.perf_counter()
    device.to_device(batch, non_blocking=True)  # not pinned, so non_blocking cannot help
    elapsed = time.perf_counter() - start
    assert 0.025 <= elapsed < 0.025 + 0.02


def test_pinned_nonblocking_copy_returns_at_once_and_step_waits_for_it() -> None:
    device = parse_device("sim:10,h2d_gbps=1")
    batch = device.pin(torch.zeros(40_000_000, dtype=torch.uint8))  # 40 ms copy
    start = time.perf_counter()
    on_device = device.to_device(batch, non_blocking=True)
    assert time.perf_counter() - start < 0.01
    device.run_step(lambda b: None, on_device)
    # the step waited for its input (40 ms), then ran (10 ms)
    assert time.perf_counter() - start >= 0.050


def test_pinned_copy_during_a_step_costs_no_extra_wall_time() -> None:
    device = parse_device("sim:60,h2d_gbps=1")
    current = device.pin(torch.zeros(1000, dtype=torch.uint8))
    following = device.pin(torch.zeros(30_000_000, dtype=torch.uint8))  # 30 ms copy < 60 ms step
    current = device.to_device(current, non_blocking=True)
    start = time.perf_counter()
    following = device.to_device(following, non_blocking=True)  # issued before the step: overlaps it
    device.run_step(lambda b: None, current)
    device.run_step(lambda b: None, following)
    elapsed = time.perf_counter() - start
    assert 0.120 <= elapsed < 0.120 + 0.02


def test_pin_is_a_copy_marked_pinned() -> None:
    device = SimDevice(10)
    original = torch.arange(6)
    pinned = device.pin({"x": original})["x"]
    assert device.is_pinned(pinned) and not device.is_pinned(original)
    assert torch.equal(pinned, original)
    assert device.pin(pinned) is pinned
