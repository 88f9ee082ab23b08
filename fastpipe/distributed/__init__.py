"""Auxiliary CPU data servers: the input pipeline's CPU stages on a Ray cluster (``pip install 'fastpipe[ray]'``).

When no single host can feed the accelerator, the article's fix is to add CPUs on other machines.
:class:`RayLoader` runs a fastpipe or torchvision-style pipeline (the raw load plus the CPU
transforms of a map-style dataset) in Ray Data tasks on any node of a Ray cluster and streams
uint8 batches to the trainer. It stands where a DataLoader stands: the measurement loop,
:class:`~fastpipe.loading._prefetch.DevicePrefetcher`, device-side transforms and ``fastpipe diagnose``
take it as they are.

Moving an existing pipeline onto a cluster is one line::

    loader = RayLoader.from_dataloader(loader, address="auto")   # "auto": the cluster `ray start` made here

Nothing in this package imports Ray until a loader needs it, so importing it (and registering
``toy:ray``) works without the extra installed.
"""

from fastpipe.distributed.loader import SUPPORTED_CACHE_POINTS, UNSUPPORTED_POINT_REASON, RayEpoch, RayLoader
from fastpipe.distributed.stats import OperatorStats, RayStats, parse_stats, ray_stats_notes

__all__ = [
    "RayLoader",
    "RayEpoch",
    "RayStats",
    "OperatorStats",
    "parse_stats",
    "ray_stats_notes",
    "SUPPORTED_CACHE_POINTS",
    "UNSUPPORTED_POINT_REASON",
]
