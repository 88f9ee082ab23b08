"""Recycled batch memory: same batches as the stock DataLoader, slots reused only when safe, nothing leaked.

The safety tests poison a slot the moment it is released (``poison=255``: every byte of its buffer
overwritten), so a batch still in use whose slot was handed back early shows it at once. Samples
never hold 255, so any 255 a step sees is a reuse under it. A control test releases a batch early
on purpose and sees the poison: the check can fail.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastpipe.loading.recycle._loader as recycle_loader
from fastpipe.devices import SimDevice, parse_device
from fastpipe.errors import ConfigError
from fastpipe.loading._prefetch import DevicePrefetcher
from fastpipe.loading.recycle import RecycledLoader, recycled, release, releasing
from tests.fakes import CountingRegistrar

Pair = collections.namedtuple("Pair", ["left", "right"])
pytestmark = pytest.mark.filterwarnings("ignore:.*pin_memory.*no accelerator")


class Marked(Dataset):
    """Sample i is an image filled with ``i % 200`` (never 255, the poison) and its index."""

    def __init__(self, length: int = 48, side: int = 16) -> None:
        self.length, self.side = length, side

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, self.side, self.side), index % 200, dtype=torch.uint8), index


class Nested(Dataset):
    """Every leaf kind default_collate handles: tensors, arrays, numbers, strings, dicts, namedtuples."""

    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": torch.arange(12, dtype=torch.float32).reshape(3, 4) + i,
            "mask": np.full((2, 2), i % 2 == 0),
            "pair": Pair(torch.tensor([i, -i]), float(i) / 3),
            "label": i,
            "name": f"sample{i}",
            "views": (torch.full((2,), i, dtype=torch.int16), np.float32(i)),
        }


def same(a: Any, b: Any) -> bool:
    """Equal values, dtypes and container types, all the way down."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def check_marked(images: torch.Tensor, labels: torch.Tensor) -> int:
    """Samples whose pixels are not all their own mark (a reuse under the step shows as 255)."""
    expected = (labels % 200).to(torch.uint8).view(-1, 1, 1, 1)
    return int((images != expected).flatten(1).any(dim=1).sum())


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_the_stock_loader_every_epoch(workers: int) -> None:
    stock = DataLoader(Nested(), batch_size=4, num_workers=workers)  # 11 samples: the last batch is short
    ring = recycled(DataLoader(Nested(), batch_size=4, num_workers=workers), slots=2)
    expected = list(stock)
    for _ in range(2):
        got = [batch for batch in ring]  # noqa: C416 (kept on purpose: every batch stays referenced)
        assert len(got) == len(expected) == 3
        assert all(same(g, e) for g, e in zip(got, expected))


@dataclasses.dataclass
class Custom:
    images: torch.Tensor
    ids: list[int]


def custom_collate(samples: list[tuple[torch.Tensor, int]]) -> Custom:
    return Custom(torch.stack([s[0] for s in samples]).permute(0, 2, 3, 1), [s[1] for s in samples])


def test_a_custom_collate_fn_is_run_and_its_tensors_recycled() -> None:
    stock = list(DataLoader(Marked(10), batch_size=4, collate_fn=custom_collate))
    ring = recycled(DataLoader(Marked(10), batch_size=4, collate_fn=custom_collate))
    got = list(ring)
    assert all(same(g, e) for g, e in zip(got, stock)) and len(got) == len(stock)
    assert got[0].images.is_contiguous()  # written contiguous into the buffer, values as the collate made them


@pytest.mark.parametrize("workers", [0, 2])
def test_slots_are_reused_and_memory_stays_within_workers_x_slots(workers: int) -> None:
    side, batch = 16, 4
    ring = recycled(DataLoader(Marked(96, side), batch_size=batch, num_workers=workers), slots=3)
    bad = sum(check_marked(images, labels) for images, labels in ring)
    stats = ring.stats()
    assert bad == 0
    assert stats["batches"] == 24
    assert stats["reused"] >= 24 - max(1, workers) * 3 - stats["fallbacks"]
    assert stats["first_buffers"] <= max(1, workers) * 3
    batch_bytes = batch * 3 * side * side + 64 + batch * 8  # images + labels, each aligned to 64 bytes
    assert stats["ring_bytes"] <= max(1, workers) * 3 * batch_bytes
    assert stats["kept"] == 0 and stats["grown"] == 0  # the short final batch (none here) would fit too


def test_a_short_final_batch_fits_its_slot() -> None:
    ring = recycled(DataLoader(Marked(10), batch_size=4), slots=2)  # batches of 4, 4, 2
    sizes = [len(labels) for _, labels in ring]
    assert sizes == [4, 4, 2]
    assert ring.stats()["grown"] == 0 and ring.stats()["first_buffers"] == 2


class Growing(Dataset):
    """Images get larger every 8 samples: batches whose shapes change."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        side = 4 + 4 * (index // 8)
        return torch.full((side, side), index % 200, dtype=torch.uint8), index


def test_changing_shapes_get_larger_buffers_and_are_counted() -> None:
    stock = list(DataLoader(Growing(), batch_size=4))
    ring = recycled(DataLoader(Growing(), batch_size=4), slots=2)
    got = [(images.clone(), labels.clone()) for images, labels in ring]
    assert all(same(g, list(e)) or same(g, tuple(e)) for g, e in zip(got, stock))
    assert ring.stats()["grown"] >= 3  # three size changes, each outgrowing the slots in turn


def test_a_kept_batch_is_never_overwritten() -> None:
    ring = recycled(DataLoader(Marked(60), batch_size=3, num_workers=2), slots=2)
    ring.poison = 255
    kept, one_sample = [], []
    for i, (images, labels) in enumerate(ring):
        if i % 4 == 0:
            kept.append((images, labels))
        if i % 5 == 1:
            one_sample.append((images[0], labels[0]))  # a view of one sample keeps the whole buffer
    assert sum(check_marked(images, labels) for images, labels in kept) == 0
    assert sum(check_marked(image[None], label[None]) for image, label in one_sample) == 0
    stats = ring.stats()
    assert stats["kept"] >= len(kept) + len(one_sample) - 2  # the last ones may still be within patience
    assert stats["replaced_kept"] >= 1  # their workers got new buffers for those slots


@pytest.mark.parametrize("route", ["loop", "prefetcher", "persistent"])
def test_slow_steps_fast_workers_never_see_a_reused_slot(route: str) -> None:
    """On cpu the step reads the host batch itself; on sim its "device" tensors alias it, so values are checked on cpu only."""
    persistent = route == "persistent"
    loader = DataLoader(Marked(64), batch_size=4, num_workers=2, prefetch_factor=4, persistent_workers=persistent, pin_memory=True)
    ring = RecycledLoader(loader, slots=2, poison=255)  # few slots: the workers run out and fall back
    batches: Any = DevicePrefetcher(ring, "cpu", depth=3) if route == "prefetcher" else ring
    epochs = 2 if persistent else 1
    bad = seen = 0
    for _ in range(epochs):
        for images, labels in batches:
            time.sleep(0.01)  # a slow step; the workers meanwhile finish their batches
            bad += check_marked(images, labels)
            seen += len(labels)
    stats = ring.stats()
    assert bad == 0 and seen == 64 * epochs
    assert stats["fallbacks"] > 0, "the workers never ran out of slots: the test did not stress the ring"
    assert stats["reused"] > 0


def test_on_sim_a_slot_goes_back_only_after_its_modelled_copy() -> None:
    device = SimDevice(step_ms=5, h2d_gbps=4 * 3 * 16 * 16 / 0.004 / 1e9)  # 4 ms per batch copy
    ring = RecycledLoader(DataLoader(Marked(40), batch_size=4, pin_memory=True), slots=3)
    freed: list[tuple[float, float]] = []
    due: dict[int, float] = {}
    original_release, original_free = RecycledLoader.release, RecycledLoader._free

    def release(self: RecycledLoader, batch: Any, after: Any = None) -> bool:
        assert isinstance(after, float), "the prefetcher releases at the copy's ready time"
        due[batch[0].data_ptr()] = after
        return original_release(self, batch, after)

    def free(self: RecycledLoader, lease: Any) -> None:
        freed.append((time.perf_counter(), due.get(lease.mapped.buffer.data_ptr(), float("inf"))))
        original_free(self, lease)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RecycledLoader, "release", release)
        patch.setattr(RecycledLoader, "_free", free)
        for images, labels in DevicePrefetcher(ring, device, depth=2):
            assert device.is_pinned(images), "ring buffers count as pinned: no copy into modelled pinned memory"
            device.run_step(lambda batch: None, (images, labels))
    assert len(freed) >= 5
    assert all(at >= ready for at, ready in freed)
    assert ring.stats()["pinning"] == "mark"


def test_explicit_release_hands_the_slot_back_at_once() -> None:
    """The control for the poison checks: a slot released under a batch does show."""
    ring = RecycledLoader(DataLoader(Marked(12), batch_size=4), slots=2, poison=255)
    iterator = iter(ring)
    images, labels = next(iterator)
    assert check_marked(images, labels) == 0
    assert release((images, labels)) is True
    assert check_marked(images, labels) == 4 and int(images.min()) == 255
    assert release((images, labels)) is False  # already released
    assert release((torch.zeros(2), torch.zeros(2))) is False  # not a recycled batch
    with releasing(next(iterator)) as (images, labels):
        assert check_marked(images, labels) == 0
    assert check_marked(images, labels) == 4
    assert ring.stats()["released"] == 2


def test_persistent_workers_keep_their_pids_and_their_ring() -> None:
    class Pids(Dataset):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.tensor([os.getpid(), index])

    ring = recycled(DataLoader(Pids(), batch_size=4, num_workers=2, persistent_workers=True), slots=3)
    pids = [{int(p) for batch in ring for p in batch[:, 0]} for _ in range(2)]
    assert len(pids[0]) == 2 and pids[0] == pids[1]
    assert ring.stats()["first_buffers"] <= 2 * 3  # epoch 2 reused epoch 1's buffers
    ring.close()


def test_it_looks_like_a_dataloader_and_rebuilds_around_another_dataset() -> None:
    loader = DataLoader(Marked(20), batch_size=5, num_workers=1, pin_memory=True, prefetch_factor=3, drop_last=True)
    ring = recycled(loader, slots=4)
    for name in ("dataset", "num_workers", "batch_size", "pin_memory", "persistent_workers", "collate_fn", "prefetch_factor", "drop_last"):
        assert getattr(ring, name) == getattr(loader, name), name
    assert len(ring) == 4
    other = ring.with_dataset(Marked(20, side=4))  # as diagnose does: the same samples, wrapped (sampler copied)
    assert isinstance(other, RecycledLoader) and other.slots == 4 and other.batch_size == 5 and other.drop_last
    assert other.sampler is not loader.sampler and type(other.sampler) is type(loader.sampler)
    assert other.prefetch_factor == 3 and other.pin_memory
    assert [tuple(images.shape) for images, _ in other] == [(5, 3, 4, 4)] * 4
    assert ring.with_dataset(Marked(20), num_workers=0).num_workers == 0


def test_bad_arguments_say_what_to_change() -> None:
    with pytest.raises(ConfigError, match="slots"):
        recycled(DataLoader(Marked()), slots=0)
    with pytest.raises(ConfigError, match="batching"):
        recycled(DataLoader(Marked(), batch_size=None))
    with pytest.raises(ConfigError, match="DataLoader"):
        recycled([1, 2, 3])  # type: ignore[arg-type]


def test_a_sim_pin_of_a_ring_batch_copies_nothing() -> None:
    device = parse_device("sim:1")
    ring = recycled(DataLoader(Marked(8), batch_size=4, pin_memory=True))
    iterator = ring.iter_for_device(device)
    images, labels = next(iterator)
    pinned_images, _ = device.pin((images, labels))
    assert pinned_images is images  # already "pinned": no memcpy on the training process
    iterator.close()


class Endless(Dataset):
    """Samples forever; with ``crash_at``, the worker that loads that index dies without any cleanup."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == self.crash_at:
            os._exit(3)
        return torch.full((3, 32, 32), index % 200, dtype=torch.uint8), index


def _train_until_stopped(strategy: str, crash_at: int | None, running: Any, ending: Any) -> None:
    """A training process (forked from the test): iterate a recycled loader until a signal or a crash ends it."""
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        loader = recycled(DataLoader(Endless(crash_at), batch_size=8, num_workers=2, persistent_workers=True))
        for i, (images, labels) in enumerate(loader):
            if i == 2:
                running.set()
            time.sleep(0.005)
    except BaseException as exc:
        ending.put(f"{type(exc).__name__}: {exc}")
        raise


def _segments() -> set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm (Linux)")
@pytest.mark.parametrize("strategy", ["file_system", "file_descriptor"])
@pytest.mark.parametrize("ending", ["crash", "ctrl-c", pytest.param("terminate", marks=pytest.mark.slow)])  # 5 s: the workers' watchdog
def test_no_shared_memory_is_left_behind(strategy: str, ending: str) -> None:
    """Worker crash, Ctrl-C and SIGTERM of the training process: /dev/shm is as it was once the processes are gone.

    PyTorch's file_system sharing names its segments in /dev/shm (the check sees them while the
    loop runs, so it can fail); file_descriptor, the default, unlinks them at once.
    """
    context = multiprocessing.get_context("fork")
    running, ending_queue = context.Event(), context.Queue()
    before = _segments()
    proc = context.Process(target=_train_until_stopped, args=(strategy, 400 if ending == "crash" else None, running, ending_queue))
    proc.start()
    try:
        assert running.wait(timeout=60), "the training process never got its batches"
        during = _segments() - before
        if ending != "crash":
            os.kill(proc.pid, signal.SIGINT if ending == "ctrl-c" else signal.SIGTERM)
        proc.join(timeout=30)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode != 0
    if ending == "crash":
        assert "exited unexpectedly" in ending_queue.get(timeout=5)
    if ending == "ctrl-c":
        assert ending_queue.get(timeout=5).startswith("KeyboardInterrupt")
    if strategy == "file_system":
        assert during, "file_system sharing names its segments in /dev/shm: the check must see them while the loop runs"
    deadline = time.monotonic() + 15  # a dead process's workers notice within 5 s; torch_shm_manager then unlinks
    while (left := _segments() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"shared-memory segments left behind: {sorted(left)[:5]}"


def test_leases_of_old_epochs_do_not_touch_new_workers_slots() -> None:
    """Without persistent workers every epoch has new workers and tables: an old batch released late is harmless."""
    ring = RecycledLoader(DataLoader(Marked(16), batch_size=4, num_workers=1), slots=2, poison=255)
    old = next(iter(ring))
    fresh = [(images.clone(), labels.clone()) for images, labels in ring]
    release(old)
    assert sum(check_marked(images, labels) for images, labels in fresh) == 0
    assert len(recycle_loader.STATE_TABLES) >= 1


def test_toy_recycled_is_toy_optimized_with_a_recycled_loader(small_toy_options: dict) -> None:
    from fastpipe.diagnosis.ladder._measure import measure_workload
    from fastpipe.workloads._workload import load_workload

    device = SimDevice(step_ms=1)
    options = {**small_toy_options, "num_workers": 2}
    plain, ring = load_workload("toy:optimized", device, **options), load_workload("toy:recycled", device, **options)
    assert isinstance(ring.loader, RecycledLoader) and not isinstance(plain.loader, RecycledLoader)
    assert ring.prefetch_depth == plain.prefetch_depth > 0 and ring.loader.batch_size == plain.loader.batch_size
    measurement = measure_workload(ring, device, warmup=2, steps=12)
    stats = ring.loader.stats()
    assert measurement.steps_per_s > 0
    assert stats["batches"] >= 14 and stats["reused"] > 0 and stats["pinning"] == "mark"


def test_a_persistent_epoch_left_midway_gives_its_unread_slots_back() -> None:
    """The DataLoader drops the batches it had in flight; their slots return to the ring, none is lost or misread."""
    ring = RecycledLoader(
        DataLoader(Marked(64), batch_size=4, num_workers=2, persistent_workers=True, prefetch_factor=3), slots=3, poison=255
    )
    for epoch in range(4):
        seen = bad = 0
        for i, (images, labels) in enumerate(ring):
            bad += check_marked(images, labels)
            seen += len(labels)
            if epoch % 2 == 0 and i == 3:
                break
        assert bad == 0 and seen == (16 if epoch % 2 == 0 else 64)
    stats = ring.stats()
    assert stats["reused"] > stats["first_buffers"] + stats["replaced_kept"]
    ring.close()


# ----- registered (page-locked) buffers are unregistered: close, garbage collection, the diagnosis -------
def registered_ring(registrar: CountingRegistrar, workers: int = 1, **loader: Any) -> RecycledLoader:
    return RecycledLoader(
        DataLoader(Marked(40), batch_size=4, num_workers=workers, pin_memory=True, **loader), slots=3, registrar=registrar.registrar
    )


def test_close_unregisters_every_buffer_and_held_batches_stay_valid() -> None:
    counter = CountingRegistrar()
    ring = registered_ring(counter)
    iterator = iter(ring)
    held = next(iterator)
    for _ in iterator:
        pass
    assert counter.registered >= 3 and counter.live, "the ring's buffers were registered"
    ring.close()
    assert not counter.live and counter.unregistered == counter.registered and not counter.errors
    assert counter.synchronized >= 1, "queued copies are waited for before the buffers are unregistered"
    assert held[0][0, 0, 0, 0].item() == 0 and held[1].tolist() == [0, 1, 2, 3]  # the batch kept its memory
    for _ in ring:  # usable again: new buffers, registered anew, unregistered again on close
        pass
    assert counter.live
    ring.close()
    assert not counter.live and not counter.errors


def test_closing_an_epoch_unregisters_what_no_batch_uses() -> None:
    counter = CountingRegistrar()
    ring = registered_ring(counter)
    iterator = iter(ring)
    held = next(iterator)
    next(iterator)
    iterator.close()
    assert len(counter.live) == 1, "only the buffer under the held batch stays registered"
    del held
    ring.close()
    assert not counter.live and not counter.errors


def test_garbage_collection_unregisters_every_buffer() -> None:
    import gc

    counter = CountingRegistrar()
    ring = registered_ring(counter, workers=0)
    held = [batch for _, batch in zip(range(3), ring)]  # three batches still held when the loader goes
    assert counter.live
    del ring
    gc.collect()
    assert not counter.live and counter.unregistered == counter.registered and not counter.errors
    assert [batch[1].tolist()[0] for batch in held] == [0, 4, 8]


def test_the_diagnosis_unregisters_each_points_loader_once_measured() -> None:
    from fastpipe.diagnosis._options import MeasureOptions
    from fastpipe.diagnosis.ladder._points import PointRunner
    from fastpipe.workloads._workload import Workload

    counter = CountingRegistrar()
    workload = Workload(loader=registered_ring(counter, workers=1), step=lambda batch: None, name="recycled")
    options = MeasureOptions(steps=2, warmup=1, budget=1.0, precision=0.5, worker_timeout=60)
    runner = PointRunner(workload, parse_device("sim:5"), options)
    runner.measure("baseline")
    assert counter.registered > 0, "the baseline's loader registered its buffers"
    assert runner.baseline_loader is not None, "kept for its stats..."
    assert not counter.live, "...but its buffers are unregistered as soon as the point is measured"
    assert runner.baseline_loader.stats()["batches"] > 0
    runner.measure("host")  # cached host batches: they live in the buffers of a loader the runner keeps
    assert counter.live
    host_loader = runner._host_loader  # alive past close, so garbage collection cannot be what unregisters its buffers
    runner.close()
    assert not counter.live and not counter.errors and host_loader is not None
