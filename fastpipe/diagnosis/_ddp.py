"""One plan for every rank: a diagnosis under ``torchrun`` (DDP) must take the same path on all ranks.

Each rank measures its own loader (its own shard, through its DistributedSampler). If each rank
then decided by its own figures when to stop measuring, which points to bisect, remeasure or
drop, ranks would take different paths and hang in the collectives of the training step. So:

* the stopping rule of every measurement is agreed after each round of workers: all ranks stop
  together, once every rank would stop (:func:`all_stop`);
* every point's figures are gathered from all ranks, and the slowest rank's stand for the point
  (the job runs at the pace of its slowest rank); all ranks hold the same figures, so every
  decision made from them is the same everywhere (:func:`slowest`);
* decisions made from one rank's own data (which points a probe drops, whether the inputs vary)
  are taken on rank 0 and broadcast (:func:`from_rank0`).

Outside DDP (no initialised process group) every function here is the identity.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


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


def all_stop(local_stop: bool) -> bool:
    """True once every rank wants to stop; all ranks get the same answer."""
    if world() is None:
        return local_stop
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if local_stop else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def from_rank0(value: T) -> T:
    """Rank 0's ``value`` on every rank."""
    if world() is None:
        return value
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


@dataclass
class RankSpread:
    """How far the ranks' step times at one point differ."""

    slowest_rank: int
    spread: float
    """(slowest - fastest) / slowest step time, 0..1."""


def slowest(result: Any) -> tuple[Any, RankSpread | None]:
    """Every rank's result for a point gathered; the slowest rank's returned on all ranks, with the spread."""
    w = world()
    if w is None:
        return result, None
    import torch.distributed as dist

    gathered: list[Any] = [None] * w[1]
    dist.all_gather_object(gathered, result)
    times = [r.ms_per_step for r in gathered]
    rank = max(range(len(times)), key=lambda i: times[i])
    return gathered[rank], RankSpread(rank, (times[rank] - min(times)) / times[rank] if times[rank] > 0 else 0.0)
