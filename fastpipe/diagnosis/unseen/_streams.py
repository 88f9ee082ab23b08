"""Streams that repeat themselves: every worker (or rank) reading the same items of an ``IterableDataset``.

A map-style dataset is split by the sampler, in the training process. A stream splits itself: its ``__iter__`` runs
in every worker, and unless it reads only its share (``torch.utils.data.get_worker_info()``, WebDataset's
``split_by_worker``, a Hugging Face dataset's own shards) each worker yields the whole source. The loop then sees
every sample ``num_workers`` times, and the loader looks fast. Under DDP the same holds across ranks.

:func:`check_stream` draws at most :data:`ITEMS_PER_WORKER` items from each worker, as the user's loader's workers
would deliver them (same ``num_workers``, ``worker_init_fn``, start method), fingerprints each inside its worker
(:mod:`._fingerprint`: a key the item carries, else its bytes) and compares the workers' sets, then the ranks'.
A WebDataset chain is read up to its last step whose items still carry ``__key__`` (so random augmentations after
it do not hide copies). It also reports uneven shares: a worker that ran out before the others (an epoch's tail
runs with fewer workers) or a rank that did (DDP stalls: the other ranks wait in the gradient all-reduce).

Bounded: a worker whose first items differ from another's is not proven disjoint further on, and a worker that
delivered its :data:`ITEMS_PER_WORKER` is not known to end with the others. The cost, stated in the report, is
the workers' start plus ``ITEMS_PER_WORKER x workers`` items.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any, Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fastpipe.diagnosis.runtime import _ddp as ddp
from fastpipe.diagnosis.unseen._fingerprint import fingerprint, sample_key

#: Items drawn from each worker.
ITEMS_PER_WORKER = 32
#: Two shares are uneven when they differ by more than this fraction of the larger (and by more than one item).
UNEVEN = 0.10

PLAIN_FIX = """import torch
from torch.utils.data import IterableDataset, get_worker_info

class MyStream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        rank, ranks = (torch.distributed.get_rank(), torch.distributed.get_world_size()) \\
            if torch.distributed.is_initialized() else (0, 1)
        share, shares = rank * workers + worker, ranks * workers   # one share per worker of every rank
        for i, item in enumerate(self.read_source()):
            if i % shares == share:                              # or: give each share its own files
                yield item"""
WEBDATASET_FIX = """import webdataset as wds

stream = wds.DataPipeline(
    wds.SimpleShardList(urls),
    wds.split_by_node,      # under DDP: each rank its own shards
    wds.split_by_worker,    # each worker its own shards (at least as many shards as workers x ranks)
    wds.tarfile_to_samples(),
    ...,                    # your decode, maps, batched
)"""
HF_FIX = """from datasets.distributed import split_dataset_by_node

# each rank its own shards (or examples); the DataLoader's workers then split the rank's shards among them
ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
print(ds.n_shards)  # give it at least num_workers shards per rank: ds.to_iterable_dataset(num_shards=...)"""


def stream_kind(dataset: Any) -> str:
    """``"webdataset"``, ``"hf"`` (a Hugging Face streaming dataset) or ``"stream"``."""
    wds = sys.modules.get("webdataset")
    if wds is not None and isinstance(dataset, wds.DataPipeline):
        return "webdataset"
    hf = sys.modules.get("datasets")
    if hf is not None and isinstance(dataset, getattr(hf, "IterableDataset", ())):
        return "hf"
    return "stream"


def keyed_prefix(dataset: Any) -> Any:
    """A WebDataset chain cut after its last step whose first item still carries ``__key__`` (the chain itself when it
    keeps its keys to the end, or is no WebDataset chain); read once here, one item per step tried."""
    if stream_kind(dataset) != "webdataset":
        return dataset
    steps = list(dataset.pipeline)
    for end in range(len(steps), 1, -1):
        cut = copy.copy(dataset)
        cut.pipeline = steps[:end]
        try:
            item = next(iter(cut), None)
        except Exception:  # a step that needs the ones after it (or a bad prefix): try a shorter one
            continue
        if sample_key(item) is not None:
            return cut
    return dataset


def _identity(item: Any) -> Any:
    return item


class _Fingerprints(IterableDataset):
    """In each worker: the first ``limit`` items of that worker's share, as (worker, fingerprint, basis), then an end
    marker (worker, None, None). Attributes a ``worker_init_fn`` reads or sets go to the user's dataset."""

    def __init__(self, dataset: Any, limit: int) -> None:
        self.__dict__.update(_dataset=dataset, _limit=limit)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_dataset", "_limit"):
            raise AttributeError(name)
        return getattr(self._dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dataset, name, value)

    def __iter__(self) -> Iterator[tuple[int, str | None, str | None]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        for item in islice(iter(self._dataset), self._limit):
            key, basis = fingerprint(item)
            yield worker, key, basis
        yield worker, None, None


@dataclass
class StreamCheck:
    """Which items each worker (and rank) of a stream delivered first, compared (see the module docstring)."""

    kind: str
    """``"webdataset"``, ``"hf"`` or ``"stream"``: which fix applies."""
    sources: list[str]
    """``"worker 0"``..., or ``"rank 1 worker 0"`` under DDP."""
    counts: list[int]
    """Items each source delivered (at most ``limit``)."""
    limit: int
    basis: str
    """What the fingerprints were taken from: ``"__key__"`` (the items' keys) or ``"bytes"`` (their contents)."""
    duplicated: int
    """Items drawn whose fingerprint another source drew too."""
    distinct: int
    """Different fingerprints among all the items drawn."""
    shared: list[tuple[str, str, int]] = field(default_factory=list)
    """(source, source, fingerprints both drew), most first."""
    seconds: float = 0.0
    """What the check cost: its loader's start and the items drawn."""

    @property
    def drawn(self) -> int:
        return sum(self.counts)

    @property
    def duplicates(self) -> bool:
        return self.duplicated > 0

    @property
    def exhausted(self) -> list[str]:
        """The sources that ran out before ``limit`` items."""
        return [s for s, n in zip(self.sources, self.counts) if n < self.limit]

    @property
    def short(self) -> list[str]:
        """The sources that ran out with fewer items than the largest share (beyond the :data:`UNEVEN` tolerance)."""
        most = max(self.counts, default=0)
        return [s for s, n in zip(self.sources, self.counts) if n < self.limit and most - n > max(1.0, UNEVEN * most)]

    @property
    def uneven(self) -> bool:
        """Some source ran out and the shares differ by more than :data:`UNEVEN` of the largest (and one item)."""
        return len(self.counts) > 1 and bool(self.short)

    def fix(self) -> str:
        return {"webdataset": WEBDATASET_FIX, "hf": HF_FIX}.get(self.kind, PLAIN_FIX)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "drawn": self.drawn, "duplicates": self.duplicates, "uneven": self.uneven, "exhausted": self.exhausted}

    def lines(self) -> list[str]:
        """The report's stream section, or one line when the stream splits evenly."""
        shares = ", ".join(f"{s}: {n}{'' if n < self.limit else '+'}" for s, n in zip(self.sources, self.counts))
        cost = f"checked {self.drawn} items ({shares}; up to {self.limit} each, by {self.basis}) in {self.seconds:.1f} s"
        if not self.duplicates and not self.uneven:
            return [f"Streams: no duplicates across {len(self.sources)} sources and even shares ({cost})."]
        out = ["Streams (what each worker or rank of the IterableDataset delivered first):"]
        if self.duplicates:
            pairs = "; ".join(f"{a} and {b} share {n}" for a, b, n in self.shared[:3])
            out.append(
                f"  - duplicates: {self.duplicated} of {self.drawn} items drawn were also drawn by another "
                f"{'rank or ' if self.sources[0].startswith('rank') else ''}worker ({pairs}): the stream does "
                f"not split its source, so the model sees each sample {self._copies()} times and the loader looks faster "
                f"than it is. {self._fix_text()}"
            )
        if self.uneven:
            out.append(
                f"  - uneven shares: {', '.join(self.short)} ran out first; a worker that ends early leaves the epoch's "
                "tail to the others, and a rank that does stalls DDP (the other ranks wait in the gradient all-reduce): "
                "give every worker and rank as many shards (or items) as the others"
                + (
                    ", or resample shards (wds.ResampledShards) with a fixed epoch length (.with_epoch(n))"
                    if self.kind == "webdataset"
                    else ""
                )
            )
        out.append(f"  ({cost})")
        if self.duplicates:
            out += ["  fix:", *("    " + line for line in self.fix().splitlines())]
        return out

    def markdown_lines(self) -> list[str]:
        lines = self.lines()
        if len(lines) == 1:
            return ["", lines[0]]
        body = [line for line in lines if not line.startswith("  fix:") and not line.startswith("    ")]
        out = ["", f"#### {body[0].rstrip(':')}", "", *(f"- {line[4:]}" if line.startswith("  - ") else line.strip() for line in body[1:])]
        return out + (["", "```python", self.fix(), "```"] if self.duplicates else [])

    def _copies(self) -> str:
        per = self.drawn / max(1, self.distinct)
        return f"about {per:.0f}" if per >= 1.5 else "some samples more than"

    def _fix_text(self) -> str:
        if self.kind == "webdataset":
            return "Fix: wds.split_by_worker after the shard list (wds.split_by_node too under DDP), below."
        if self.kind == "hf":
            return "Fix: datasets.distributed.split_dataset_by_node per rank, and at least num_workers shards, below."
        return "Fix: read only this worker's (and rank's) share, from torch.utils.data.get_worker_info(), below."


def check_stream(loader: Any, *, limit: int = ITEMS_PER_WORKER, timeout: float = 120.0) -> StreamCheck | None:
    """Draw at most ``limit`` items per worker of ``loader``'s stream and compare them (module docstring); None when the
    loader is no DataLoader over an ``IterableDataset``, or reads it with no workers outside DDP (one source). Every rank must call it under DDP (the ranks' sets are gathered)."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not isinstance(dataset, IterableDataset):
        return None
    workers = loader.num_workers
    if workers == 0 and ddp.world() is None:
        return None  # one source, nothing to compare it with (and the user's own stream would be read here, in this process)
    started = time.perf_counter()
    check = DataLoader(
        _Fingerprints(keyed_prefix(dataset), limit),
        batch_size=None,
        num_workers=workers,
        collate_fn=_identity,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        timeout=loader.timeout or (timeout if workers else 0),
    )
    seen: dict[int, list[str]] = {w: [] for w in range(max(1, workers))}
    basis = "bytes"
    for worker, key, kind in check:
        if key is not None:
            seen[worker].append(key)
            basis = kind or basis
    mine = [(f"worker {w}", keys) for w, keys in sorted(seen.items())]
    w = ddp.world()
    if w is not None:
        everyone = ddp.all_objects(mine)
        mine = [(f"rank {r} {name}", keys) for r, theirs in enumerate(everyone) for name, keys in theirs]
    return _compare(stream_kind(dataset), mine, limit, basis, time.perf_counter() - started)


def _compare(kind: str, sources: list[tuple[str, list[str]]], limit: int, basis: str, seconds: float) -> StreamCheck:
    owners: dict[str, set[int]] = {}
    for index, (_, keys) in enumerate(sources):
        for key in keys:
            owners.setdefault(key, set()).add(index)
    duplicated = sum(1 for _, keys in sources for key in keys if len(owners[key]) > 1)
    sets = [set(keys) for _, keys in sources]
    shared = [
        (sources[a][0], sources[b][0], len(sets[a] & sets[b]))
        for a in range(len(sources))
        for b in range(a + 1, len(sources))
        if sets[a] & sets[b]
    ]
    shared.sort(key=lambda t: t[2], reverse=True)
    counts = [len(keys) for _, keys in sources]
    return StreamCheck(kind, [name for name, _ in sources], counts, limit, basis, duplicated, len(owners), shared, seconds)
