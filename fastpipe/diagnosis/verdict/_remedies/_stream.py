"""The raw load of a streaming dataset: a WebDataset chain's shard read, or another stream's items in order.

A stream has no ``__getitem__`` to speed up and no image folder to swap, so none of the decode drop-ins fit it; what
limits it is how many readers can run at once (for WebDataset, the shards: it deals out whole shards, never single
samples) and whether whole batches cross from the workers. The chain's steps are recognised by identity with
webdataset's own objects, never by name.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from fastpipe.diagnosis.verdict._remedies._base import Advice


def stream_raw_load(dataset: object | None) -> Advice | None:
    """The raw load of a streaming dataset (an ``IterableDataset``), or None for a map-style one.

    A stream has no ``__getitem__`` to speed up and no image folder to swap: its raw load is reading items in order.
    For a WebDataset chain that is the shard read: webdataset splits the shard list among nodes and DataLoader workers
    (``split_by_node``, ``split_by_worker``), never single samples, so workers read in parallel only as many shards as
    there are (its docs: round-robin needs at least as many shards as workers; ``resampled=True`` draws shards with
    replacement and ``with_epoch`` sets the epoch's length instead)."""
    from torch.utils.data import IterableDataset

    if not isinstance(dataset, IterableDataset):
        return None
    shards = webdataset_shards(dataset)
    if shards is None:
        return Advice(
            summary=(
                f"Raw load: reading the stream's items in order ({type(dataset).__name__}.__iter__ and its source), in "
                "each worker's own share of the stream. Read faster or in parallel: local or faster storage, larger "
                "sequential reads, and a source split among the DataLoader workers (get_worker_info()) so that more "
                "num_workers read different items at once; a shuffle buffer on raw (encoded) items, not random reads."
            )
        )
    if shards.resampled:
        parallel = (
            f"its {shards.count} shards are drawn with replacement (resampled=True), so every worker has shards to "
            "read: raise num_workers while cores are idle, with with_epoch setting each worker's epoch"
        )
    else:
        empty = (
            "more workers than that fail (a worker with no shard raises 'No samples found' unless the WebDataset is "
            "built with empty_check=False, and then reads nothing)"
            if shards.empty_check
            else "a worker with no shard reads nothing (empty_check=False)"
        )
        parallel = (
            f"this chain lists {shards.count} shards, dealt out to the workers whole, so at most {shards.per_rank()} "
            f"num_workers read at once{shards.ranks_text()}; {empty}; to read with more workers, write the data as "
            "more, smaller shards, or read with resampled=True and with_epoch"
        )
    batching = (
        "the chain batches already, so read its batches whole (DataLoader(batch_size=None)) and whole batches cross from the workers."
        if shards.batches
        else "batch inside the chain (.batched, with DataLoader(batch_size=None)) so whole batches cross from the workers."
    )
    return Advice(
        summary=(
            "Raw load: the shard read (opening each tar shard, reading it in order and grouping each sample's files; "
            "a .decode() in the chain is a stage of its own). WebDataset splits shards, not samples, among nodes and DataLoader "
            f"workers, so read more shards in parallel: {parallel}. Keep the reads sequential and local: shards on local "
            "or fast storage, large enough to stream; shuffle with shardshuffle=<n> (the order of whole shards) and "
            f".shuffle(<n>) (a sample buffer), never by random access; {batching}"
        )
    )


@dataclass(frozen=True)
class ShardList:
    """What a WebDataset chain's shard list allows in parallel: ``count`` shards listed, drawn with replacement
    (``resampled``), split among ``ranks`` processes first when ``split_by_node`` is in the chain (``by_node``; the world
    size this process sees, 1 outside a distributed run), whether a worker with no shard raises (``empty_check``, the
    WebDataset default), and whether the chain already ``batches``."""

    count: int
    resampled: bool
    empty_check: bool
    by_node: bool
    ranks: int
    batches: bool

    def per_rank(self) -> int:
        """Shards one rank reads: ``split_by_node`` deals them out round-robin, so the first ranks get the extra one."""
        return -(-self.count // self.ranks) if self.by_node and self.ranks > 1 else self.count

    def ranks_text(self) -> str:
        """How the shards are shared among ranks, when ``split_by_node`` shares them."""
        if not self.by_node:
            return ""
        if self.ranks > 1:
            return f" (split_by_node deals the {self.count} shards among {self.ranks} ranks: at most {self.per_rank()} per rank)"
        return " per rank when not distributed (split_by_node divides them among the ranks of a distributed run: shards / world size each)"

    def limit_text(self, needed: int) -> str | None:
        """When ``needed`` workers (the waiting text's estimate) exceed the shards one rank reads: the shards are the
        limit, and the sentence says so; None when they are not, or when shards are drawn with replacement."""
        if self.resampled or needed <= self.per_rank():
            return None
        return (
            f"This chain cannot give those {needed} workers a shard each: a rank reads at most {self.per_rank()} shards "
            "at once, so the shards, not num_workers, are the limit (write more, smaller shards, or read with "
            "resampled=True and with_epoch)."
        )


def webdataset_shards(dataset: object) -> ShardList | None:
    """The shard list of a WebDataset chain (:class:`ShardList`), read from its steps; None for another stream.

    Its steps are webdataset's own objects (``split_by_node``, ``check_empty``, a ``ResampledShards`` list, the
    ``batched`` filter), found by identity: a user's function that happens to share a name is not one of them.
    """
    wds = sys.modules.get("webdataset")
    if wds is None or not isinstance(dataset, wds.DataPipeline):
        return None
    steps = list(getattr(dataset, "pipeline", []))
    split_by_node = getattr(wds, "split_by_node", None)
    check_empty = getattr(sys.modules.get("webdataset.compat"), "check_empty", None)
    batched = getattr(wds.filters.batched, "f", None)
    for step in steps:
        urls = getattr(step, "urls", None)
        if isinstance(urls, (list, tuple)):
            by_node = split_by_node is not None and any(each is split_by_node for each in steps)
            return ShardList(
                count=len(urls),
                resampled=isinstance(step, getattr(wds, "ResampledShards", ())),
                empty_check=check_empty is not None and any(each is check_empty for each in steps),
                by_node=by_node,
                ranks=max(1, int(wds.utils.pytorch_worker_info()[1])) if by_node else 1,
                batches=any(batched is not None and getattr(each, "f", None) is batched for each in steps),
            )
    return None
