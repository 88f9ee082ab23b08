"""DevicePrefetcher on the cpu and sim devices: structure, order, epochs, shutdown, and overlap.

The CUDA path (side stream, events, record_stream) is tested in test_prefetch_gpu.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import namedtuple
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.devices import Device, SimDevice, parse_device
from fastpipe.diagnosis.ladder._measure import measure_workload
from fastpipe.errors import ConfigError
from fastpipe.loading._prefetch import DevicePrefetcher, make_prefetcher
from fastpipe.workloads._workload import Workload

Sample = namedtuple("Sample", ["image", "label"])


@dataclasses.dataclass
class Meta:
    weights: torch.Tensor
    name: str


def nested_batch(i: int) -> dict[str, Any]:
    """A batch with tensors inside a dict, list, tuple, namedtuple and dataclass, plus non-tensor leaves."""
    return {
        "sample": Sample(torch.full((2, 3), i, dtype=torch.uint8), torch.tensor([i, i + 1])),
        "extras": [torch.arange(4) + i, ("keep", i)],
        "meta": Meta(torch.ones(3) * i, f"batch{i}"),
    }


class Numbers(Dataset):
    """Item i is tensor(i); optionally raises at one index, to test error ordering."""

    def __init__(self, length: int, fail_at: int | None = None) -> None:
        self.length, self.fail_at = length, fail_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.fail_at:
            raise ValueError(f"bad sample {index}")
        return torch.tensor(index)


class Payload(Dataset):
    """Items of fixed byte size, so a batch's modelled copy time is known."""

    def __init__(self, length: int, floats: int) -> None:
        self.length, self.floats = length, floats

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.floats,), float(index))


DEVICES = ["cpu", "sim:1"]
# A DataLoader with pin_memory=True warns when the machine cannot pin; on cpu that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:.*pin_memory.*no accelerator")


def check_same_structure(out: Any, expected: Any, device: Device) -> None:
    assert type(out) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert out.device == device.torch_device
        assert out.dtype == expected.dtype and torch.equal(out, expected)
        if isinstance(device, SimDevice):
            assert device.is_pinned(out), "the prefetcher pins what the loader left pageable"
            assert device.ready_time(out) > 0, "every tensor goes through the modelled copy engine"
    elif isinstance(expected, dict):
        assert list(out) == list(expected)
        for key in expected:
            check_same_structure(out[key], expected[key], device)
    elif isinstance(expected, (list, tuple)):
        assert len(out) == len(expected)
        for a, b in zip(out, expected):
            check_same_structure(a, b, device)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            check_same_structure(getattr(out, field.name), getattr(expected, field.name), device)
    else:
        assert out == expected


@pytest.mark.parametrize("spec", DEVICES)
def test_nested_batches_arrive_on_the_device(spec: str) -> None:
    device = parse_device(spec)
    batches = [nested_batch(i) for i in range(5)]
    out = list(DevicePrefetcher(batches, device, depth=2))
    assert len(out) == len(batches)
    for got, expected in zip(out, batches):
        check_same_structure(got, expected, device)


@pytest.mark.parametrize("spec", DEVICES)
@pytest.mark.parametrize("depth", [1, 2, 3, 7])
@pytest.mark.parametrize("pin_memory", [False, True])
def test_order_kept_and_no_batch_lost_or_repeated(spec: str, depth: int, pin_memory: bool) -> None:
    loader = DataLoader(Numbers(10), batch_size=3, pin_memory=pin_memory)  # 4 batches, the last one short
    prefetcher = DevicePrefetcher(loader, spec, depth=depth)
    batches = list(prefetcher)
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    assert torch.cat(batches).tolist() == list(range(10))
    assert len(prefetcher) == len(batches)


@pytest.mark.parametrize("spec", DEVICES)
def test_iteration_stops_and_stays_stopped(spec: str) -> None:
    iterator = iter(DevicePrefetcher(DataLoader(Numbers(4), batch_size=2), spec))
    assert [b.tolist() for b in iterator] == [[0, 1], [2, 3]]
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(iterator)


@pytest.mark.parametrize("spec", DEVICES)
def test_every_epoch_is_complete_and_a_broken_epoch_restarts(spec: str) -> None:
    prefetcher = DevicePrefetcher(DataLoader(Numbers(7), batch_size=2, pin_memory=True), spec, depth=2)
    first = iter(prefetcher)
    assert next(first).tolist() == [0, 1]
    epochs = [[b.tolist() for b in prefetcher] for _ in range(3)]  # the first iter() is abandoned mid-epoch
    assert epochs == [[[0, 1], [2, 3], [4, 5], [6]]] * 3
    with pytest.raises(StopIteration):
        next(first)  # a new epoch closed the abandoned one


@pytest.mark.parametrize("spec", DEVICES)
def test_a_loader_error_arrives_after_the_batches_before_it(spec: str) -> None:
    iterator = iter(DevicePrefetcher(DataLoader(Numbers(10, fail_at=5), batch_size=2), spec, depth=3))
    assert next(iterator).tolist() == [0, 1]  # the failing batch was already fetched, but not yet due
    assert next(iterator).tolist() == [2, 3]
    with pytest.raises(ValueError, match="bad sample 5"):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)


@pytest.mark.parametrize("spec", DEVICES)
def test_transform_runs_after_the_copy(spec: str) -> None:
    device = parse_device(spec)
    batches = [Sample(torch.full((2, 2), 51 * i, dtype=torch.uint8), torch.tensor(i)) for i in range(4)]
    seen: list[bool] = []

    def to_float(batch: Sample) -> Sample:
        if isinstance(device, SimDevice):
            seen.append(device.ready_time(batch.image) > 0)  # the copy was issued before the transform
        return Sample(batch.image.float() / 255, batch.label)

    out = list(DevicePrefetcher(batches, device, transform=to_float))
    assert [b.image.dtype for b in out] == [torch.float32] * 4
    assert [b.image[0, 0].item() for b in out] == pytest.approx([0.0, 0.2, 0.4, 0.6])
    assert [b.label.item() for b in out] == [0, 1, 2, 3]
    assert all(seen)


def test_empty_loader_yields_nothing() -> None:
    assert list(DevicePrefetcher([], "sim:1")) == []


def test_close_shuts_down_workers_and_the_pin_thread() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    loader = DataLoader(Payload(64, 16), batch_size=2, num_workers=2, pin_memory=True)
    iterator = iter(DevicePrefetcher(loader, "sim:1"))
    next(iterator)
    started = {p.pid for p in me.children(recursive=True)} - before
    assert len(started) == 2
    assert any(t.name == "fastpipe-pin-memory" and t.is_alive() for t in threading.enumerate())
    iterator.close()
    assert not ({p.pid for p in me.children(recursive=True)} & started)
    assert not any(t.name == "fastpipe-pin-memory" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(StopIteration):
        next(iterator)


def test_sim_copies_are_issued_without_blocking_the_host() -> None:
    batch_bytes = 4 * 250_000
    device = SimDevice(step_ms=1, h2d_gbps=batch_bytes / 0.040 / 1e9)  # 40 ms a batch
    iterator = iter(DevicePrefetcher(DataLoader(Payload(8, 250_000), batch_size=1, pin_memory=True), device, depth=2))
    start = time.perf_counter()
    batch = next(iterator)  # issues three copies: 120 ms of copy-engine work
    returned = time.perf_counter()
    assert returned - start < 0.040
    assert device.ready_time(batch) > returned, "the first batch's copy is still in flight when it is handed over"
    iterator.close()


def _pipeline(prefetch_depth: int, device: SimDevice, floats: int) -> Workload:
    loader = DataLoader(Payload(4 * 40, floats), batch_size=4, pin_memory=True)
    return Workload(loader=loader, step=lambda batch: None, prefetch_depth=prefetch_depth)


@pytest.mark.parametrize("step_ms, copy_ms", [(50, 30), (20, 40)])
def test_prefetching_overlaps_the_copy_with_the_step(step_ms: float, copy_ms: float) -> None:
    """Inline, each step waits for its own copy; prefetched, the copy runs during the previous step.

    A copy shorter than the step then adds no wall time; a longer one sets the pace alone.
    """
    floats = 62_500  # 4 x 250 kB = 1 MB a batch
    gbps = 4 * floats * 4 / (copy_ms / 1000) / 1e9
    results = {}
    for depth in (0, 2):
        device = SimDevice(step_ms=step_ms, h2d_gbps=gbps)
        results[depth] = measure_workload(_pipeline(depth, device, floats), device, warmup=2, steps=12).mean_step_s * 1000
    inline, prefetched = results[0], results[2]
    assert inline >= 0.97 * (step_ms + copy_ms), f"inline copy must add its full time: {inline:.1f} ms"
    hidden = min(step_ms, copy_ms)
    assert prefetched < max(step_ms, copy_ms) + hidden / 3, f"prefetched copy must overlap the step: {prefetched:.1f} ms"
    assert prefetched > 0.97 * max(step_ms, copy_ms), "neither the step nor the copy can be skipped"


def test_bad_arguments_say_what_to_change() -> None:
    for depth in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="depth"):
            DevicePrefetcher([], "cpu", depth=depth)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="transform"):
        DevicePrefetcher([], "cpu", transform=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'fastpipe', 'tnt'"):
        make_prefetcher([], "cpu", depth=2, transform=None, kind="dali")
    with pytest.raises(TypeError, match="has no len"):
        len(DevicePrefetcher((b for b in []), "cpu"))


def test_make_prefetcher_builds_fastpipes_from_a_spec() -> None:
    prefetcher = make_prefetcher([torch.zeros(1)], "sim:1", depth=3, transform=None, kind="fastpipe")
    assert isinstance(prefetcher, DevicePrefetcher)
    assert isinstance(prefetcher.device, SimDevice) and prefetcher.depth == 3
    assert prefetcher.stream is None  # only CUDA has a side stream


class WorkerPids(Dataset):
    """Item i is the pid of the worker process that loaded it."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        import os

        return torch.tensor(os.getpid())


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("spec", DEVICES)
def test_persistent_workers_survive_epochs(spec: str) -> None:
    """The same worker pids serve epoch 2; an epoch's end stops only fastpipe's pin thread; close() stops the workers."""
    loader = DataLoader(WorkerPids(8), batch_size=2, num_workers=2, persistent_workers=True, pin_memory=True)
    prefetcher = DevicePrefetcher(loader, spec, depth=2)
    epochs = []
    for _ in range(3):
        epochs.append({int(pid) for batch in prefetcher for pid in batch})
        assert epochs[-1] <= _children(), "the workers are still running after the epoch ended"
        assert not any(t.name == "fastpipe-pin-memory" and t.is_alive() for t in threading.enumerate())
    assert len(epochs[0]) == 2 and epochs[0] == epochs[1] == epochs[2]
    abandoned = iter(prefetcher)
    next(abandoned)  # an epoch left midway: the next one still gets the same workers
    assert {int(pid) for batch in prefetcher for pid in batch} == epochs[0]
    last = iter(prefetcher)
    next(last)
    last.close()
    assert not (_children() & epochs[0]), "close() stops persistent workers too"


@pytest.mark.parametrize("spec", DEVICES)
def test_workers_that_are_not_persistent_stop_when_the_epoch_ends(spec: str) -> None:
    prefetcher = DevicePrefetcher(DataLoader(WorkerPids(8), batch_size=2, num_workers=2, pin_memory=True), spec)
    epochs = []
    for _ in range(2):
        iterator = iter(prefetcher)
        epochs.append({int(pid) for batch in iterator for pid in batch})
        assert not (_children() & epochs[-1])
    assert not (epochs[0] & epochs[1])
