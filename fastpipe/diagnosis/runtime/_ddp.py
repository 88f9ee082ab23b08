"""One plan for every rank: a diagnosis under ``torchrun`` (DDP) must take the same path on all ranks.

Each rank measures its own loader (its own shard, through its DistributedSampler). If each rank
then decided by its own figures when to stop measuring, which points to bisect, remeasure or
drop, ranks would take different paths and hang in the collectives of the training step. So:

* the stopping rule of every measurement is a vote after each round of workers: all ranks stop
  together, once every rank would stop (:func:`vote`);
* a point that fails on any rank fails on all: a rank whose measurement raised casts a failure
  vote instead of its next round's, every rank sees it, and the failing rank's error is sent to
  all (:func:`vote`, :func:`from_rank`), so all of them drop the point, or stop, with one reason;
* every point's figures are gathered from all ranks, and the slowest rank's stand for the point
  (the job runs at the pace of its slowest rank); all ranks hold the same figures, so every
  decision made from them is the same everywhere (:func:`slowest`);
* decisions made from one rank's own data (which points a probe drops, whether the inputs vary)
  are taken on rank 0 and broadcast (:func:`from_rank0`).

Collectives run where the process group's backend can run them (:func:`collective_device`): on
the CPU for gloo (and MPI, and a group with a ``cpu:`` backend), on the rank's own GPU for NCCL,
which has no CPU path. Outside DDP (no initialised process group) every function here is the identity.

A training step with collectives of its own (DDP's gradient all-reduce) still waits for the
other ranks as the job itself would: a rank that fails while another is inside such a step is
seen once that step returns, or at the backend's timeout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")

#: Backends with a CPU path: their collectives take CPU tensors.
CPU_BACKENDS = ("gloo", "mpi", "ucc")
#: Backends that run on one accelerator per rank, by device type.
DEVICE_BACKENDS = {"nccl": "cuda", "xccl": "xpu", "hccl": "hpu"}


def world() -> tuple[int, int] | None:
    """(rank, world size) inside an initialised process group of more than one rank, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist.get_rank(), dist.get_world_size()


def is_rank0() -> bool:
    w = world()
    return w is None or w[0] == 0


def local_rank(device_type: str = "cuda") -> int:
    """This rank's accelerator index: torchrun's ``LOCAL_RANK`` when that device exists, else the current device.

    A job that shows each rank one GPU (``CUDA_VISIBLE_DEVICES`` per rank) has ``LOCAL_RANK`` beyond
    the devices it can see; then the current device (0) is the rank's own.
    """
    module = getattr(torch, device_type)
    count = module.device_count()
    value = os.environ.get("LOCAL_RANK")
    if value is not None and value.isdigit() and int(value) < count:
        return int(value)
    return module.current_device() if count else 0


def device_for(backend: str, rank: int | None = None) -> torch.device:
    """Where the tensors of a collective must live for a process group on ``backend``, as ``dist.get_backend()`` names it.

    ``"gloo"``, ``"mpi"``, ``"ucc"`` and any ``"cpu:..."`` in a per-device list (``"cpu:gloo,cuda:nccl"``):
    the CPU. ``"nccl"``: ``cuda:<rank>`` (``rank`` defaults to :func:`local_rank`); likewise ``xccl``
    (XPU) and ``hccl`` (HPU). Anything else: the CPU.
    """
    names = [part.strip() for part in backend.lower().split(",") if part.strip()]
    per_device = dict(part.split(":", 1) for part in names if ":" in part)
    if "cpu" in per_device or any(name in CPU_BACKENDS for name in names):
        return torch.device("cpu")
    for name in list(per_device.values()) + names:
        device_type = DEVICE_BACKENDS.get(name)
        if device_type is not None:
            return torch.device(device_type, local_rank(device_type) if rank is None else rank)
    return torch.device("cpu")


def collective_device() -> torch.device:
    """The device for this process group's collectives (see :func:`device_for`)."""
    import torch.distributed as dist

    return device_for(str(dist.get_backend()))


@dataclass(frozen=True)
class Vote:
    """The outcome of one vote of every rank."""

    stop: bool
    """Every rank wanted to stop."""
    failed: tuple[int, ...]
    """The ranks whose measurement failed (empty when none did)."""


def vote(stop: bool, failed: bool = False) -> Vote:
    """Every rank's wish to stop and whether it failed, added up; all ranks get the same :class:`Vote`.

    Under DDP every rank must call it equally often: once after each round of a measurement, and a
    rank whose measurement raised calls it once more with ``failed=True`` in place of its next round.
    """
    w = world()
    if w is None:
        return Vote(stop, (0,) if failed else ())
    import torch.distributed as dist

    rank, size = w
    ballot = torch.zeros(size + 1, dtype=torch.int32)
    ballot[0] = 1 if stop else 0
    ballot[1 + rank] = 1 if failed else 0
    ballot = ballot.to(collective_device())
    dist.all_reduce(ballot, op=dist.ReduceOp.SUM)
    counts = ballot.cpu().tolist()
    return Vote(counts[0] == size, tuple(r for r in range(size) if counts[1 + r]))


def all_stop(local_stop: bool) -> bool:
    """True once every rank wants to stop; all ranks get the same answer (a :func:`vote` without failures)."""
    return vote(local_stop).stop


def from_rank(src: int, value: T) -> T:
    """Rank ``src``'s ``value`` on every rank."""
    if world() is None:
        return value
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=src, device=collective_device())
    return holder[0]


def from_rank0(value: T) -> T:
    """Rank 0's ``value`` on every rank."""
    return from_rank(0, value)


@dataclass
class RankSpread:
    """How far the ranks' step times at one point differ."""

    slowest_rank: int
    spread: float
    """(slowest - fastest) / slowest step time, 0..1."""


def slowest(result: Any) -> tuple[Any, RankSpread | None]:
    """Every rank's step time for a point gathered; the slowest rank's result returned on all ranks, with the spread."""
    w = world()
    if w is None:
        return result, None
    import torch.distributed as dist

    device = collective_device()
    mine = torch.tensor([float(result.ms_per_step)], dtype=torch.float64).to(device)
    gathered = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(w[1])]
    dist.all_gather(gathered, mine)
    times = [float(t.item()) for t in gathered]
    rank = max(range(len(times)), key=lambda i: times[i])
    return from_rank(rank, result), RankSpread(rank, (times[rank] - min(times)) / times[rank] if times[rank] > 0 else 0.0)


def all_objects(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank (``[value]`` outside DDP)."""
    w = world()
    if w is None:
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * w[1]
    dist.all_gather_object(gathered, value)
    return gathered
