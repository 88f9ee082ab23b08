"""``toy:ray``: the optimized toy pipeline with its CPU stages running as Ray Data tasks.

It is ``toy:optimized`` (uint8 workers, colour and scale on the device, prefetching) with the
DataLoader swapped for a :class:`~fastpipe.distributed.RayLoader` built from it, so the two
differ only in who runs the CPU stages. ``num_workers`` becomes the CPUs the Ray tasks use.

The cluster: ``address=`` (or Ray's own ``RAY_ADDRESS`` environment variable, which is how the
command line reaches a real cluster: ``RAY_AUTH_MODE=token RAY_ADDRESS=HEAD_IP:6379 fastpipe diagnose
toy:ray``, plus ``RAY_AUTH_TOKEN`` off the head: see :mod:`fastpipe.distributed.auth`); without one,
a local cluster that fastpipe starts and stops.

Importing this module registers the variant and does not import Ray.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from fastpipe.devices import Device
from fastpipe.distributed.loader import RayLoader
from fastpipe.workloads._workload import Workload
from fastpipe.workloads.toy.workloads import register_variant


@register_variant("ray")
def make_ray(
    device: Device,
    *,
    num_workers: int | None = None,
    address: str | None = None,
    nodes: int | Sequence[str] | None = None,
    object_store_memory: int | None = None,
    prefetch_batches: int = 2,
    preserve_order: bool = False,
    **options: Any,
) -> Workload:
    """``toy:optimized`` fed by Ray Data tasks; ``options`` are the toy's own (sizes, batch, model...).

    ``num_workers`` is the number of CPUs the Ray tasks may use; by default the local
    DataLoader's (the article's 4, capped at this machine's cores), or, on a cluster named by
    ``address``/``RAY_ADDRESS``, every CPU of the cluster. ``num_workers=0`` also means every CPU.
    """
    from fastpipe.workloads.toy.optimized import OPTIMIZED, make_toy_variant  # the fast transforms, loaded only when used

    remote = address is not None or bool(os.environ.get("RAY_ADDRESS"))
    base = make_toy_variant(device, OPTIMIZED, name="toy:ray", num_workers=num_workers, **options)
    cpus = num_workers if num_workers is not None else (None if remote else base.loader.num_workers)
    loader = RayLoader.from_dataloader(
        base.loader,
        device=device,
        num_cpus=cpus or None,
        address=address,
        nodes=nodes,
        object_store_memory=object_store_memory,
        prefetch_batches=prefetch_batches,
        preserve_order=preserve_order,
    )
    where = f"the Ray cluster at {address or os.environ.get('RAY_ADDRESS')}" if remote else "a local Ray cluster fastpipe starts"
    cpus_text = f"{cpus} CPU(s)" if cpus else "every CPU"
    notes = [*base.notes, f"toy:ray: the raw load and CPU transforms run as Ray Data tasks on {cpus_text} of {where}"]
    return dataclasses.replace(base, loader=loader, notes=notes)
