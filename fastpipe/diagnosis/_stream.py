"""Cache points for streaming datasets (an ``IterableDataset``): capture in each worker, then replay.

A stream cannot be re-read by index, so :class:`CachePointIterable` does in ``__iter__`` what
:class:`~fastpipe.diagnosis._cache.CachePointDataset` does in ``__getitem__``: in each worker it reads the first
``pool`` items of that worker's own share of the stream (the dataset's own sharding decides which), keeps them at the
point, and from then on replays them, rerunning only the stages after the point. Two shapes of stream:

* a transform the dataset's ``__iter__`` calls on each item (a ``transform`` attribute, or a :class:`fastpipe.Stages`
  with ``source=``): the transform is replaced on a copy by a recorder, exactly as for a map-style dataset, and each
  item the stream yields is a template the rerun outputs are put back into; the source is not read while replaying;
* a WebDataset chain (``kind="webdataset"``): the chain is cut after the point's stage, the cut chain's first
  ``pool`` items are kept, and the rest of the chain (its own filters: maps, ``batched``, ``shuffle``...) runs on an
  endless cycle of copies of them, so batching done in the pipeline stays in the pipeline.

The replay never ends: the measurement counts the steps (:func:`fastpipe.diagnosis._measure.measure_until`), so a
point's time per step is the steady state of the stages below it. A worker whose share of the stream is empty
yields nothing, as it does in the user's loader. Copies are timed into the same shared ledger as the map-style cache,
each counted as the samples its item holds (a whole batch when the chain is cut after ``batched``).

:class:`TimedStream` is the stage-cost pass's view of a stream: per-stage wall, CPU and run-queue time of each item.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from itertools import islice
from typing import Any, Callable, Iterator

from torch.utils.data import IterableDataset

from fastpipe.diagnosis._cache import (
    CachePointDataset,
    PointProbe,
    UnavailablePoint,
    _Call,
    _Capture,
    _Entry,
    _entry_from,
    _locate_all,
    _Recorder,
    _within,
    fresh_copy,
    unplaceable,
)
from fastpipe.diagnosis._cachepoint import BASELINE, SAMPLE
from fastpipe.stages import RAW_STAGE, StageError, TransformPipeline


class CachePointIterable(CachePointDataset, IterableDataset):
    """A streaming dataset with data cached at one point (see the module docstring); the arguments are
    :class:`~fastpipe.diagnosis._cache.CachePointDataset`'s. Never modifies the user's dataset."""

    def __len__(self) -> int:
        return len(self.dataset)  # a stream without a length raises TypeError here, as the user's does

    def __iter__(self) -> Iterator[Any]:
        if self.point == BASELINE:
            return self._baseline()
        if self.point == SAMPLE:
            return _cycle(list(islice(iter(self.dataset), self.pool)))
        if self.pipeline is not None and self.pipeline.kind == "webdataset":
            return self._replay_chain()
        entries = self.capture_items()
        return self._replay_items(entries) if entries else iter(())

    def _baseline(self) -> Iterator[Any]:
        if self.pipeline is None or self.pipeline.kind == "webdataset":
            return iter(self.dataset)
        return iter(self.pipeline.with_transform(self.dataset, self.pipeline.run))  # a failure names its stage

    # ----- a transform called on each item --------------------------------------------------------
    def capture_items(self, count: int | None = None) -> list[_Entry]:
        """The first ``count`` (default ``pool``) items of this process's share, each with the value at the point.

        Raises UnavailablePoint when an item cannot be rebuilt from its capture (the transform's output is changed
        before it is yielded, or items are buffered so calls and items do not pair up)."""
        assert self.pipeline is not None and self.cut is not None
        recorder = _Recorder(self.pipeline, self.cut, self.skip_copies)
        stream = iter(self.pipeline.with_transform(self.dataset, recorder))
        method = f"{type(self.dataset).__name__}.__iter__"
        entries = []
        try:
            for _ in range(self.pool if count is None else count):
                before = len(recorder.calls)
                try:
                    item = next(stream)
                except StopIteration:
                    break
                calls = recorder.calls[before:]
                if unplaceable(method, item, calls) is not None:
                    raise UnavailablePoint.because(self.point, _why_unpaired(method, item, recorder.calls, before, stream))
                self.calls_per_sample = len(calls)
                entries.append(_entry_from(_Capture(item, calls, None), self.skip_copies))
        finally:
            _close(stream)
        return entries

    def _replay_items(self, entries: list[_Entry]) -> Iterator[Any]:
        while True:
            for entry in entries:
                yield self._serve(entry)

    # ----- a WebDataset chain ---------------------------------------------------------------------
    def _replay_chain(self) -> Iterator[Any]:
        assert self.pipeline is not None and self.cut is not None
        captured = list(islice(iter(cut_chain(self.dataset, self.pipeline, self.cut)), self.pool))
        if not captured:
            return
        batching = open_batches(self.pipeline, self.cut)
        stream: Iterator[Any] = self._copies(captured, [samples_in(value, batching) for value in captured])
        for stage in self.pipeline.stages[self.cut :]:
            stream = stage.transform(stream)
        yield from stream

    def _copies(self, captured: list[Any], samples: list[int]) -> Iterator[Any]:
        """Endless copies of the captured items (the rest of the chain may change them in place), timed; each copy
        is counted as the ``samples`` its item holds (a batch, when the chain is cut after ``batched``), so the ledger's
        copy time per sample is per sample, as attribution's copy discount (x batch size) needs it."""
        while True:
            for value, count in zip(captured, samples):
                began = self.clock()
                copied = fresh_copy(value)
                self._record(self.clock() - began, True, count)
                yield copied


def cut_chain(dataset: Any, pipeline: TransformPipeline, stop: int) -> Any:
    """A shallow copy of a WebDataset ``DataPipeline`` that ends after its first ``stop`` stages (the shard read kept).

    The copy has no epoch limit (``nsamples=-1``; its ``repetitions`` are kept, so a ``with_epoch`` chain still reads
    its shards again and again): ``with_epoch(n)`` counts what the whole chain yields (batches, when it batches), so on
    a shorter chain it would cut the epoch short; whoever needs the user's epoch limits the full chain's output
    (:func:`epoch_limit`).
    """
    clone = copy.copy(dataset)
    clone.pipeline = list(dataset.pipeline[: pipeline.offset + stop])
    if getattr(dataset, "nsamples", -1) > 0:
        clone.nsamples = -1
    return clone


def epoch_limit(dataset: Any) -> int | None:
    """How many items an epoch of the whole WebDataset chain yields (``with_epoch(n)``: n), or None when unlimited;
    read as ``DataPipeline.__iter__`` reads it."""
    nsamples = getattr(dataset, "nsamples", -1)
    return nsamples if getattr(dataset, "repetitions", 1) != 1 and isinstance(nsamples, int) and nsamples > 0 else None


def open_batches(pipeline: TransformPipeline, stop: int) -> list[Any]:
    """The ``batched`` steps among a WebDataset chain's first ``stop`` stages that no later ``unbatched`` undid: an
    item cut there is a batch of batches of ... (one level per step); empty when it is one sample."""
    wds = sys.modules.get("webdataset")
    if wds is None:
        return []
    batched, unbatched = getattr(wds.filters.batched, "f", None), getattr(wds.filters.unbatched, "f", None)
    found: list[Any] = []
    for stage in pipeline.stages[:stop]:
        f = getattr(stage.transform, "f", None)
        if f is None:
            continue
        if f is batched:
            found.append(stage.transform)
        elif f is unbatched and found:
            found.pop()
    return found


def samples_in(item: Any, batching: list[Any]) -> int:
    """How many samples ``item`` holds, cut after the ``batching`` steps (:func:`open_batches`): 1 for a sample; for
    a batch, its rows (a partial last batch counts what it has), else the ``batchsize`` the step was given."""
    if not batching:
        return 1
    sizes = [_batch_args(step)[0] for step in batching]
    if len(batching) > 1:  # batches of batches: the sizes the steps were given
        return max(1, math.prod(sizes))
    rows = _rows(item, collated=_batch_args(batching[0])[1])
    return rows if rows else max(1, sizes[0])


def _batch_args(step: Any) -> tuple[int, bool]:
    """(batchsize, whether samples are collated) of a ``webdataset.filters.batched`` step, with its defaults."""
    args, kw = tuple(getattr(step, "args", ())), dict(getattr(step, "kw", {}))
    size = args[0] if args else kw.get("batchsize", 20)
    collate = args[1] if len(args) > 1 else kw.get("collation_fn", True)
    return (size if isinstance(size, int) else 1), collate is not None


def _rows(batch: Any, collated: bool) -> int | None:
    """The samples in one batch: a list of samples (no collation), or columns of equal length (a dict or tuple of
    stacked tensors, arrays and lists, as ``webdataset``'s default collation makes); None when it cannot tell."""
    if not collated:
        return len(batch) if isinstance(batch, (list, tuple)) else None
    columns = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    for column in columns:
        shape = getattr(column, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(column, (list, tuple)):
            return len(column)
    return None


def _why_unpaired(method: str, item: Any, calls: list[_Call], first: int, stream: Iterator[Any]) -> str:
    """Why the transform calls made while the stream produced ``item`` (``calls[first:]``) cannot be put back into it.

    A buffer between the transform and the yield (a shuffle buffer, a prefetch queue) pairs an item with calls made
    for earlier or later items: the item holds an earlier call's output, or only some of its own calls' outputs and the
    next item an earlier one or another number of calls (read once more to tell this from a stream that changes one
    of two views). Anything else changed the output on its way out, as a map-style ``__getitem__`` can."""
    if not calls[first:]:
        return unplaceable(method, item, []) or ""
    if _holds(item, calls[:first]) or (_holds(item, calls[first:]) and _next_unpaired(calls, len(calls) - first, stream)):
        return (
            f"{method} holds the transform's outputs in a buffer before yielding them (a shuffle or prefetch buffer: the "
            "item it yields was made by the transform for an earlier item), so a cached value cannot be put back in its "
            "place and the cache cannot stand in for the stages before the buffer, which reorders and holds samples; only "
            "finished samples are cached (the sample point). To measure each stage, put the buffer before the stages: "
            "shuffle the raw items in the source, `self.stages = fastpipe.Stages(source=<shuffled raw items>, "
            "transforms=[<each step>, ...])`, and yield each output as it comes (`return iter(self.stages)`); a buffer of "
            "raw (encoded) items also holds less memory than one of decoded samples"
        )
    return (
        f"{method} changes its transform's output before yielding it (e.g. `yield self.transform(x).float(), y`), so a "
        "cached value cannot be put back in its place; to get this point, make that last step the transform's final "
        "stage (for a fastpipe.Stages(source=...), the last of its transforms=[...])"
    )


def _holds(item: Any, calls: list[_Call]) -> bool:
    """Whether ``item`` holds (by identity) the output of any of ``calls``."""
    return any(_locate_all(item, call.output) for call in calls)


def _next_unpaired(calls: list[_Call], per_item: int, stream: Iterator[Any]) -> bool:
    """Reads one more item: whether it holds the output of a call made before it was asked for, or took another number
    of calls than the item before (``per_item``): a buffer fills with many calls, then takes one an item; a stream
    that changes one of two views makes two calls for every item."""
    first = len(calls)  # ``calls`` is the recorder's own list: the next item's calls are appended to it
    try:
        following = next(stream)
    except StopIteration:
        return False
    return _holds(following, calls[:first]) or len(calls) - first != per_item


def _cycle(items: list[Any]) -> Iterator[Any]:
    while items:
        yield from items


def _close(stream: Iterator[Any]) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        close()


def probe_stream_point(dataset: Any, pipeline: TransformPipeline | None, point: str, *, timeout: float | None = None) -> PointProbe:
    """:func:`fastpipe.diagnosis._cache.probe_point` for a stream: one item captured in this process (no worker, so
    the whole stream is this process's share). A WebDataset chain is cut, not recorded, so it needs no probe."""
    try:
        cached = CachePointIterable(dataset, pipeline, point)
    except UnavailablePoint as exc:
        return PointProbe(point, exc.reason, None, False)
    if cached.cut is None or (pipeline is not None and pipeline.kind == "webdataset"):
        return PointProbe(point, None, None, cached.cut is not None)
    try:
        entries = _within(timeout, lambda: cached.capture_items(1), "reading the stream's first item in the main process")
    except UnavailablePoint as exc:
        return PointProbe(point, exc.reason, cached.calls_per_sample, False)
    if not entries:
        return PointProbe(point, "the stream yielded no item in the main process", None, False)
    return PointProbe(point, None, cached.calls_per_sample, any(view.shared is None for view in entries[0].views))


# ----- the stage-cost pass ------------------------------------------------------------------------


class TimedStream(IterableDataset):
    """A stream whose every item is timed by stage into this process's stage-cost ledger.

    ``ledger`` is a callable returning the ledger (:mod:`fastpipe.diagnosis.stagecost._timing`'s), ``runner`` wraps a
    pipeline so its stages report to it. A transform called per item is replaced (on a copy) by the timed runner, and
    what the item took beyond its stages is the raw load. A WebDataset chain gets each filter timed in place: a
    filter's own time is the time spent in it minus the time its upstream took, and each item leaving the shard read
    counts as one sample (so with ``batched`` in the chain, costs stay per sample). An epoch is the chain's own:
    ``with_epoch(n)`` limits the whole chain's items (batches, when it batches), not the shard read's samples.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        pipeline: TransformPipeline | None,
        ledger: Callable[[], Any],
        runner: Callable[[TransformPipeline], Any],
    ) -> None:
        self.dataset, self.pipeline, self.ledger, self.runner = dataset, pipeline, ledger, runner

    def __iter__(self) -> Iterator[Any]:
        if self.pipeline is not None and self.pipeline.kind == "webdataset":
            return self._timed_chain()
        source = self.dataset if self.pipeline is None else self.pipeline.with_transform(self.dataset, self.runner(self.pipeline))
        return self._timed_items(iter(source))

    def _timed_items(self, source: Iterator[Any]) -> Iterator[Any]:
        while True:
            ledger = self.ledger()
            ledger.start_sample()
            wall0, cpu0, runq0 = time.perf_counter(), ledger.cpu_clock(), ledger.runq_clock()
            try:
                item = next(source)
            except StopIteration:
                return
            except StageError:
                raise
            except Exception as exc:
                raise StageError.wrap(RAW_STAGE, exc) from exc
            ledger.end_sample(time.perf_counter() - wall0, ledger.cpu_clock() - cpu0, ledger.runq_clock() - runq0)
            yield item

    def _timed_chain(self) -> Iterator[Any]:
        assert self.pipeline is not None
        stream: Iterator[Any] = _Timed(RAW_STAGE, None, self.ledger, raw=True)(iter(cut_chain(self.dataset, self.pipeline, 0)))
        for stage in self.pipeline.stages:
            stream = _Timed(stage.name, stage.transform, self.ledger)(stream)
        limit = epoch_limit(self.dataset)  # the user's epoch: n items of the whole chain, as DataPipeline.__iter__ cuts it
        return stream if limit is None else islice(stream, limit)


class _Timed:
    """One step of a chain, timed: its own time per item is the time its ``next`` took less its upstream's."""

    def __init__(
        self, name: str, step: Callable[[Iterator[Any]], Iterator[Any]] | None, ledger: Callable[[], Any], raw: bool = False
    ) -> None:
        self.name, self.step, self.ledger, self.raw = name, step, ledger, raw
        self.upstream = [0.0, 0.0, 0.0]

    def _feed(self, source: Iterator[Any]) -> Iterator[Any]:
        """The upstream as the step sees it, its time counted (to be taken off the step's)."""
        ledger = self.ledger()
        while True:
            wall0, cpu0, runq0 = time.perf_counter(), ledger.cpu_clock(), ledger.runq_clock()
            try:
                item = next(source)
            except StopIteration:
                return
            self.upstream[0] += time.perf_counter() - wall0
            self.upstream[1] += ledger.cpu_clock() - cpu0
            self.upstream[2] += ledger.runq_clock() - runq0
            yield item

    def __call__(self, source: Iterator[Any]) -> Iterator[Any]:
        ledger = self.ledger()
        inner = source if self.step is None else iter(self.step(self._feed(source)))
        while True:
            self.upstream = [0.0, 0.0, 0.0]
            wall0, cpu0, runq0 = time.perf_counter(), ledger.cpu_clock(), ledger.runq_clock()
            try:
                item = next(inner)
            except StopIteration:
                return
            except StageError:
                raise
            except Exception as exc:
                raise StageError.wrap(self.name, exc) from exc
            wall = time.perf_counter() - wall0 - self.upstream[0]
            cpu = ledger.cpu_clock() - cpu0 - self.upstream[1]
            runq = ledger.runq_clock() - runq0 - self.upstream[2]
            ledger.pending.add(self.name, max(0.0, wall), max(0.0, cpu), max(0.0, runq))
            if self.raw:
                ledger.pending.samples += 1
            yield item
