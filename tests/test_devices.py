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
    device.synchronize()
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
    device.synchronize()
    # the step waited for its input (40 ms), then ran (10 ms)
    assert time.perf_counter() - start >= 0.050


def test_pinned_copy_during_a_step_costs_no_extra_wall_time() -> None:
    device = parse_device("sim:60,h2d_gbps=1")
    current = device.pin(torch.zeros(1000, dtype=torch.uint8))
    following = device.pin(torch.zeros(30_000_000, dtype=torch.uint8))  # 30 ms copy < 60 ms step
    current = device.to_device(current, non_blocking=True)
    start = time.perf_counter()
    with device.side_stream():  # as a prefetcher does: the copy does not queue behind the step
        following = device.to_device(following, non_blocking=True)
    device.run_step(lambda b: None, current)
    device.run_step(lambda b: None, following)
    device.synchronize()
    elapsed = time.perf_counter() - start
    assert 0.120 <= elapsed < 0.120 + 0.02


def test_a_copy_on_the_compute_stream_waits_for_the_step_before_it() -> None:
    device = parse_device("sim:60,h2d_gbps=1")
    current = device.to_device(device.pin(torch.zeros(1000, dtype=torch.uint8)), non_blocking=True)
    following = device.pin(torch.zeros(30_000_000, dtype=torch.uint8))  # 30 ms copy
    start = time.perf_counter()
    device.run_step(lambda b: None, current)
    following = device.to_device(following, non_blocking=True)  # tensor.to(device) on the step's stream
    device.run_step(lambda b: None, following)
    device.synchronize()
    elapsed = time.perf_counter() - start
    assert 0.150 <= elapsed < 0.150 + 0.02  # step, then copy, then step: nothing overlaps


def _loop_with_host_cost(spec: str, host_ms: float, steps: int = 12) -> float:
    """Seconds per step of a loop whose host spends ``host_ms`` (CPU-free) per batch before each step."""
    from fastpipe.diagnosis.ladder._measure import measure_steps

    device = parse_device(spec)

    def next_batch() -> None:
        time.sleep(host_ms / 1000)  # receiving, pinning: main-process work per batch

    measurement = measure_steps(next_batch, lambda batch: device.run_step(None, batch), warmup=2, steps=steps, device=device)
    return measurement.mean_step_s


def test_async_step_hides_main_process_work_and_sync_does_not() -> None:
    asynchronous = _loop_with_host_cost("sim:60", 20)
    synchronous = _loop_with_host_cost("sim:60,sync=1", 20)
    assert asynchronous == pytest.approx(0.060, rel=0.08)  # at the bound: the host works while the step runs
    assert synchronous == pytest.approx(0.080, rel=0.08)  # every step waits for the host's 20 ms


def test_host_blocks_only_when_the_queue_is_full() -> None:
    device = parse_device("sim:50,queue=2")
    start = time.perf_counter()
    device.run_step(None, None)
    device.run_step(None, None)
    launched_two = time.perf_counter() - start
    device.run_step(None, None)  # the third waits for the first to finish
    launched_three = time.perf_counter() - start
    device.synchronize()
    assert launched_two < 0.02
    assert 0.05 <= launched_three < 0.07
    assert time.perf_counter() - start >= 0.150


@pytest.mark.parametrize("spec", ["sim:10,sync=2", "sim:10,queue=0", "sim:10,queue=1.5", "sim:10,speed=3"])
def test_bad_sim_options_say_how_to_fix(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"e\.g\. --device"):
        parse_device(spec)


def test_pin_is_a_copy_marked_pinned() -> None:
    device = SimDevice(10)
    original = torch.arange(6)
    pinned = device.pin({"x": original})["x"]
    assert device.is_pinned(pinned) and not device.is_pinned(original)
    assert torch.equal(pinned, original)
    assert device.pin(pinned) is pinned
