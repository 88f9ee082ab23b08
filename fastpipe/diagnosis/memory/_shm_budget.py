"""Shared-memory budget, before the crash: predict the loader's peak ``/dev/shm`` use and check it fits.

A DataLoader worker collates every batch straight into a new shared-memory segment, which lives until
the training process lets go of the batch. At the peak, when the loop stalls (a slow step, a checkpoint,
an evaluation), every one of the ``num_workers x prefetch_factor`` batches the loader keeps in flight is
collated and waiting, and the loop holds one more (the batch it is stepping on, or with ``pin_memory``
the one the pin thread is copying)::

    shm peak    = batch bytes x (num_workers x prefetch_factor + 1)
    pinned peak = batch bytes x (num_workers x prefetch_factor + 1)      only with the pin path active

``fastpipe.loading.recycled`` replaces the fresh segments with a ring of ``slots`` buffers per worker, each
sized from the first batch (``num_workers x slots x batch bytes``), pinned in place: no pinned copies.

Shared memory is a tmpfs: it fails with "Bus error" when the filesystem is full (64 MB by default in a
Docker container), and its pages count towards the container's memory limit (cgroup v2 ``memory.max``,
v1 ``memory.limit_in_bytes``), where the OOM killer ends the job instead. :func:`check_shm_budget`
compares the prediction with both and words the fixes, before any worker starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

from fastpipe.diagnosis.memory._probes import SHM_PATH, shm_filesystem

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
#: A cgroup v1 limit this large means none (2**63 rounded down to a page).
NO_LIMIT = 1 << 62
#: Headroom the advised ``--shm-size`` leaves above the prediction.
SHM_SIZE_MARGIN = 1.5


def size_text(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class MemoryLimits:
    """What the machine allows: the shared-memory filesystem and the cgroup's memory limit (None: unknown or none)."""

    shm_size: int | None
    shm_free: int | None
    cgroup_limit: int | None
    cgroup_usage: int | None
    cgroup_file: str | None = None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= NO_LIMIT else value


def cgroup_memory(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> tuple[int | None, int | None, str | None]:
    """(limit, usage, the limit's file) of this process's memory cgroup; v2 first, then v1; Nones when unlimited or unknown."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        lines = []
    v2 = [path for parts in lines if len(parts) == 3 and parts[0] == "0" and parts[1] == "" for path in [parts[2]]]
    v1 = [path for parts in lines if len(parts) == 3 and "memory" in parts[1].split(",") for path in [parts[2]]]
    candidates = []
    for path in v2:  # the process's own group, then the root of the mount (a container sees its own group there)
        candidates += [(os.path.join(root, path.lstrip("/")), "memory.max", "memory.current"), (root, "memory.max", "memory.current")]
    for path in v1:
        base = os.path.join(root, "memory")
        candidates += [
            (os.path.join(base, path.lstrip("/")), "memory.limit_in_bytes", "memory.usage_in_bytes"),
            (base, "memory.limit_in_bytes", "memory.usage_in_bytes"),
        ]
    if not lines:
        candidates += [
            (root, "memory.max", "memory.current"),
            (os.path.join(root, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"),
        ]
    for folder, limit_name, usage_name in candidates:
        limit_file = os.path.join(folder, limit_name)
        if not os.path.exists(limit_file):
            continue
        return _read_int(limit_file), _read_int(os.path.join(folder, usage_name)), limit_file
    return None, None, None


def read_limits(shm_path: str = SHM_PATH, cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> MemoryLimits:
    """The shared-memory filesystem's size and free bytes, and the memory cgroup's limit and usage."""
    fs = shm_filesystem(shm_path)
    limit, usage, where = cgroup_memory(cgroup_root, proc_cgroup)
    return MemoryLimits(
        shm_size=fs[0] if fs else None, shm_free=fs[1] if fs else None, cgroup_limit=limit, cgroup_usage=usage, cgroup_file=where
    )


def pin_active(loader: Any) -> bool:
    """Whether the loader's pin thread runs: ``pin_memory`` and an accelerator present (else DataLoader turns it off)."""
    import torch

    source = getattr(loader, "source", loader)
    return bool(getattr(source, "pin_memory", False)) and torch.cuda.is_available()


@dataclass(frozen=True)
class ShmPrediction:
    """The peak a loader setting may hold: shared memory and pinned host memory, with what it was predicted from."""

    batch_bytes: int
    num_workers: int
    prefetch_factor: int
    pin: bool
    ring_slots: int | None
    """``fastpipe.loading.recycled``'s buffers per worker; None for a stock loader."""
    batches: int
    """Batches in shared memory at the peak."""
    shm_bytes: int
    pinned_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def formula(self) -> str:
        if self.ring_slots is not None:
            return f"{max(1, self.num_workers)} worker ring(s) x {self.ring_slots} slots x {size_text(self.batch_bytes)}"
        if self.num_workers == 0:
            return "no workers: batches stay in the training process"
        return (
            f"{size_text(self.batch_bytes)} per batch x ({self.num_workers} workers x prefetch_factor {self.prefetch_factor} + 1 "
            f"{'being pinned' if self.pin else 'held by the loop'})"
        )


def loader_settings(loader: Any) -> tuple[int, int, int | None]:
    """(num_workers, prefetch_factor, ring slots or None) of a DataLoader or a ``fastpipe.loading.recycled`` loader."""
    source = getattr(loader, "source", loader)
    workers = int(getattr(source, "num_workers", 0) or 0)
    prefetch = int(getattr(source, "prefetch_factor", None) or (2 if workers else 0))
    slots = getattr(loader, "slots", None) if source is not loader else None
    return workers, prefetch, slots


def predict_shm(loader: Any, batch_bytes: int, *, pin: bool | None = None) -> ShmPrediction:
    """The peak shared and pinned memory of ``loader`` with batches of ``batch_bytes`` (see the module docstring)."""
    workers, prefetch, slots = loader_settings(loader)
    pin = pin_active(loader) if pin is None else pin
    if slots is not None:
        batches = max(1, workers) * slots
        pinned = batches * batch_bytes if pin else 0  # the ring itself, pinned in place: no copies
    elif workers == 0:
        batches, pinned = 0, (batch_bytes if pin else 0)
    else:
        batches = workers * prefetch + 1
        pinned = batches * batch_bytes if pin else 0
    return ShmPrediction(
        batch_bytes=batch_bytes,
        num_workers=workers,
        prefetch_factor=prefetch,
        pin=pin,
        ring_slots=slots,
        batches=batches,
        shm_bytes=batches * batch_bytes,
        pinned_bytes=pinned,
    )


def _fixes(prediction: ShmPrediction, room: int, float32_bytes: int | None) -> list[str]:
    b, w, p = prediction.batch_bytes, prediction.num_workers, prediction.prefetch_factor
    fixes = []
    if prediction.ring_slots is None and w:
        fitting = [f for f in range(p - 1, 0, -1) if b * (w * f + 1) <= room]
        if fitting:
            fixes.append(
                f"a smaller prefetch_factor: DataLoader(..., prefetch_factor={fitting[0]}) holds about {size_text(b * (w * fitting[0] + 1))}"
            )
        else:
            fitting_w = [n for n in range(w - 1, 0, -1) if b * (n + 1) <= room]
            fixes.append(
                "prefetch_factor=1 is not enough ("
                + size_text(b * (w + 1))
                + "); "
                + (f"also num_workers={fitting_w[0]}" if fitting_w else "a smaller batch_size too")
            )
    if float32_bytes:
        smaller = prediction.shm_bytes - prediction.batches * float32_bytes * 3 // 4
        fixes.append(
            f"uint8 batches: keep images uint8 through collate and convert on the device (fastpipe.transforms.device.Normalize); "
            f"about {size_text(smaller)} instead"
        )
    if prediction.ring_slots is None and w:
        slots = max(1, p)
        fixes.append(
            f"recycled memory: fastpipe.loading.recycled(loader, slots={slots}) writes into a fixed ring of {w} x {slots} buffers "
            f"({size_text(w * slots * b)}), sized once"
            + (
                f", and pins it in place instead of copying each batch into pinned memory ({size_text(prediction.pinned_bytes)} "
                "of host memory saved)"
                if prediction.pinned_bytes
                else ""
            )
        )
    need = math.ceil(prediction.shm_bytes * SHM_SIZE_MARGIN / 2**30 * 4) / 4
    fixes.append(
        f"in a container, a larger shared-memory filesystem: docker run --shm-size={need:g}g (or Kubernetes: an emptyDir "
        f"with medium: Memory mounted at {SHM_PATH})"
    )
    return fixes


def check_shm_budget(
    loader: Any, batch_bytes: int, *, float32_bytes: int | None = None, limits: MemoryLimits | None = None, pin: bool | None = None
) -> str | None:
    """A warning when ``loader`` would not fit its shared memory (or its cgroup's memory), with the fixes; None when it fits.

    Args:
        loader: a DataLoader or a ``fastpipe.loading.recycled`` loader (its settings are read, nothing is run).
        batch_bytes: one batch's bytes (every tensor in it).
        float32_bytes: of those, the bytes in float32 tensors (uint8 would take a quarter); None when unknown.
        limits: the machine's limits; read now when None (tests pass their own).
        pin: whether the pin thread runs; None decides as DataLoader does.
    """
    prediction = predict_shm(loader, batch_bytes, pin=pin)
    if prediction.shm_bytes == 0:
        return None
    limits = read_limits() if limits is None else limits
    problems, room = [], None
    if limits.shm_free is not None and prediction.shm_bytes > limits.shm_free:
        problems.append(
            f"{SHM_PATH} has {size_text(limits.shm_free)} free (of {size_text(limits.shm_size)}): workers would die "
            "with 'Bus error' (DataLoader worker killed by signal: Bus error)"
        )
        room = limits.shm_free
    if limits.cgroup_limit is not None:
        headroom = limits.cgroup_limit - (limits.cgroup_usage or 0)
        held = prediction.shm_bytes + prediction.pinned_bytes
        if held > headroom:
            problems.append(
                f"the memory cgroup ({limits.cgroup_file}) allows {size_text(limits.cgroup_limit)}, {size_text(headroom)} "
                f"of it unused, and shared pages{' plus pinned copies' if prediction.pinned_bytes else ''} "
                f"({size_text(held)}) count towards it: the OOM killer would end the job"
            )
            room = headroom - prediction.pinned_bytes if room is None else min(room, headroom - prediction.pinned_bytes)
    if not problems:
        return None
    fixes = _fixes(prediction, max(0, room or 0), float32_bytes)
    return "\n".join(
        [
            f"shared memory will not fit: the loader may hold {size_text(prediction.shm_bytes)} of batches in {SHM_PATH} "
            f"({prediction.formula()}), but " + "; and ".join(problems) + ".",
            "fixes:",
            *(f"  - {fix}" for fix in fixes),
        ]
    )
