"""Parts that move batches from the DataLoader to the device: the prefetcher, pinning, recycled batch memory.

Lives here: the hooks a loader may declare (``_protocols``), ``DevicePrefetcher`` and its arguments, the torchtnt adapter, the pinning helpers that shut
workers down cleanly, and ``recycle`` (shared-memory rings). It may import only the base modules
(``errors``, ``devices``, ``_tree``, ``_system``); the diagnosis and the workloads import it, never the reverse.
"""

from fastpipe.loading._prefetch import DevicePrefetcher, make_prefetcher
from fastpipe.loading._protocols import (
    BatchesWhole,
    LoaderStats,
    PinsForDevice,
    RebuildsAroundDataset,
    ReportsStats,
    StageClock,
    StageClocks,
    StagesOutsideWorkers,
    TimesOwnStages,
    WrapsLoader,
)
from fastpipe.loading._unwrap import Unwrapped, unwrap_loader
from fastpipe.loading.recycle import RecycledLoader, recycled, release, releasing

__all__ = [
    "BatchesWhole",
    "DevicePrefetcher",
    "LoaderStats",
    "PinsForDevice",
    "RebuildsAroundDataset",
    "RecycledLoader",
    "ReportsStats",
    "StageClock",
    "StageClocks",
    "StagesOutsideWorkers",
    "TimesOwnStages",
    "Unwrapped",
    "WrapsLoader",
    "make_prefetcher",
    "recycled",
    "release",
    "releasing",
    "unwrap_loader",
]
