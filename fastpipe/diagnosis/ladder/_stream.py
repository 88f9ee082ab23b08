"""Cache points for streaming datasets (an ``IterableDataset``): capture in each worker, then replay.

A stream cannot be re-read by index, so :class:`CachePointIterable` does in ``__iter__`` what
:class:`~fastpipe.diagnosis.ladder._cache.CachePointDataset` does in ``__getitem__``: in each worker it reads the first
``pool`` items of that worker's own share of the stream (the dataset's own sharding decides which), keeps them at the
point, and from then on replays them, rerunning only the stages after the point. Two shapes of stream:

* a transform the dataset's ``__iter__`` calls on each item (a ``transform`` attribute, or a :class:`fastpipe.stages.Stages`
  with ``source=``): the transform is replaced on a copy by a recorder, exactly as for a map-style dataset, and each
  item the stream yields is a template the rerun outputs are put back into; the source is not read while replaying;
* a WebDataset chain (``kind="webdataset"``): the chain is cut after the point's stage, the cut chain's first
  ``pool`` items are kept, and the rest of the chain (its own filters: maps, ``batched``, ``shuffle``...) runs on an
  endless cycle of copies of them, so batching done in the pipeline stays in the pipeline.

The replay never ends: the measurement counts the steps (:func:`fastpipe.diagnosis.ladder._measure.measure_until`), so a
point's time per step is the steady state of the stages below it. A worker whose share of the stream is empty
yields nothing, as it does in the user's loader. Copies are timed into the same shared ledger as the map-style cache,
each counted as the samples its item holds (a whole batch when the chain is cut after ``batched``).

:class:`TimedStream` is the stage-cost pass's view of a stream: per-stage wall, CPU and run-queue time of each item.
"""

from __future__ import annotations

import copy
import math
import operator
import sys
from itertools import islice
from typing import Any, Callable, Iterator

from torch.utils.data import IterableDataset

from fastpipe.diagnosis.ladder._batches import first_shape
from fastpipe.diagnosis.ladder._cache import (
    CachePointDataset,
    PointProbe,
    UnavailablePoint,
    _Call,
    _Capture,
    _Entry,
    _entry_from,
    _locate_all,
    _Recorder,
    fresh_copy,
    unplaceable,
)
from fastpipe.diagnosis.ladder._cachepoint import BASELINE, SAMPLE
from fastpipe.diagnosis.runtime._timeout import within as _within
from fastpipe.stages import RAW_STAGE, StageError, TransformPipeline


class CachePointIterable(CachePointDataset, IterableDataset):
    """A streaming dataset with data cached at one point (see the module docstring); the arguments are
    :class:`~fastpipe.diagnosis.ladder._cache.CachePointDataset`'s. Never modifies the user's dataset."""

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
        batching = open_batches(self.dataset, self.pipeline, self.cut)
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


def cut_chain(dataset: Any, pipeline: TransformPipeline, stop: int, *, once: bool = False) -> Any:
    """A shallow copy of a WebDataset ``DataPipeline`` that ends after its first ``stop`` stages (the shard read kept).

    The copy has no epoch limit (``nsamples=-1``): ``with_epoch(n)`` counts what the whole chain yields (batches, when
    it batches), so on a shorter chain it would cut the epoch short; whoever needs the user's epoch limits the full
    chain's output (:func:`epoch_limit`). Its ``repetitions`` are kept (a ``with_epoch`` chain reads its shards again
    and again, and ``DataPipeline.iterator`` stops after a pass that yields nothing, which sees the kept filters), unless
    ``once``: then it reads one pass, for a caller that runs the rest of the chain itself and must repeat the passes
    around the whole chain (:func:`chain_passes`), since an empty pass of the whole chain is what ends the epoch.
    """
    clone = copy.copy(dataset)
    clone.pipeline = list(dataset.pipeline[: pipeline.offset + stop])
    if getattr(dataset, "nsamples", -1) > 0:
        clone.nsamples = -1
    if once:
        clone.repetitions = 1
    return clone


def chain_passes(dataset: Any, one_pass: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """The whole chain's items as ``DataPipeline.__iter__`` yields them, each pass being ``one_pass()`` (a one-pass read
    through the chain's filters): ``repetitions`` passes, ending after a pass that yields nothing (a filter that drops
    every sample would otherwise read the shards forever), cut at the user's epoch (:func:`epoch_limit`). Each pass ends
    its own partial batches, as the user's chain does."""

    def passes() -> Iterator[Any]:
        for _ in range(getattr(dataset, "repetitions", 1)):
            count = 0
            for item in one_pass():
                count += 1
                yield item
            if count == 0:
                return

    limit = epoch_limit(dataset)
    return passes() if limit is None else islice(passes(), limit)


def epoch_limit(dataset: Any) -> int | None:
    """How many items an epoch of the whole WebDataset chain yields (``with_epoch(n)``: n), or None when unlimited;
    read as ``DataPipeline.__iter__`` reads it."""
    try:  # any integer (with_epoch(np.int64(n)) is read by islice as n)
        nsamples = operator.index(getattr(dataset, "nsamples", -1))
    except TypeError:
        return None
    return nsamples if getattr(dataset, "repetitions", 1) != 1 and nsamples > 0 else None


def open_batches(dataset: Any, pipeline: TransformPipeline, stop: int) -> list[Any]:
    """The ``batched`` steps of a WebDataset chain up to the end of its first ``stop`` stages that no later
    ``unbatched`` undid: an item cut there is a batch of batches of ... (one level per step); empty when it is one
    sample. The whole chain up to the cut is read, not only the recognised stages: a ``batched`` before a step the
    discovery does not know (``.compose(f)``) is part of the "shard read", and still batches."""
    wds = sys.modules.get("webdataset")
    if wds is None:
        return []
    batched, unbatched = getattr(wds.filters.batched, "f", None), getattr(wds.filters.unbatched, "f", None)
    found: list[Any] = []
    for step in list(getattr(dataset, "pipeline", []))[: pipeline.offset + stop]:
        f = getattr(step, "f", None)
        if f is None:
            continue
        if f is batched:
            found.append(step)
        elif f is unbatched and found:
            found.pop()
    return found


def samples_in(item: Any, batching: list[Any]) -> int:
    """How many samples ``item`` holds, cut after the ``batching`` steps (:func:`open_batches`): 1 for a sample; for
    a batch, its rows counted level by level (a partial batch counts what it has), else the product of the
    ``batchsize`` each step was given."""
    if not batching:
        return 1
    rows = _rows(item, [_batch_args(step) for step in batching])
    return rows if rows else max(1, math.prod(size for size, _ in (_batch_args(step) for step in batching)))


def _batch_args(step: Any) -> tuple[int, bool]:
    """(batchsize, whether samples are collated) of a ``webdataset.filters.batched`` step, with its defaults."""
    args, kw = tuple(getattr(step, "args", ())), dict(getattr(step, "kw", {}))
    size = args[0] if args else kw.get("batchsize", 20)
    collate = args[1] if len(args) > 1 else kw.get("collation_fn", True)
    return (size if isinstance(size, int) else 1), collate is not None


def _rows(batch: Any, levels: list[tuple[int, bool]]) -> int | None:
    """The samples in ``batch`` made by the batching ``levels`` (:func:`_batch_args` of each step, outermost last);
    None when it cannot tell.

    An uncollated level is a list of what the level below made: the sum of their rows. Collated levels stack: the
    first array of the batch (top-level columns first: :func:`~fastpipe.diagnosis.ladder._batches.first_shape`, the batch size
    the loader's batches are read with) has one leading dimension per collated level, so the rows are the product of
    those dimensions; a list column is not a row count (torch's ``default_collate`` makes two views a list of two
    stacked tensors). Only a batch with no array anywhere (all strings) counts the length of its first list column,
    which both collations make one entry per row. A collated level above an uncollated one gives None (the caller
    falls back to the steps' sizes: a partial batch is then over-counted)."""
    collated = levels[-1][1]
    if not collated:
        if not isinstance(batch, (list, tuple)):
            return None
        if len(levels) == 1:
            return len(batch)
        inner = [_rows(part, levels[:-1]) for part in batch]
        return None if any(rows is None for rows in inner) else sum(inner)  # type: ignore[arg-type]
    if not all(each for _, each in levels):
        return None
    shape = first_shape(batch)
    if shape is not None:
        return math.prod(shape[: len(levels)]) if len(shape) >= len(levels) else None
    if len(levels) > 1:
        return None
    columns = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else []
    return next((len(column) for column in columns if isinstance(column, (list, tuple))), None)


def _why_unpaired(method: str, item: Any, calls: list[_Call], first: int, stream: Iterator[Any]) -> str:
    """Why the transform calls made while the stream produced ``item`` (``calls[first:]``) cannot be put back into it.

    A buffer between the transform and the yield (a shuffle buffer, a prefetch queue) pairs an item with calls made
    for earlier or later items: the item holds an earlier call's output, or only some of its own calls' outputs and the
    next item an earlier one or another number of calls (read once more to tell this from a stream that changes one
    of two views). Anything else changed the output on its way out, as a map-style ``__getitem__`` can."""
    if not calls[first:]:
        return unplaceable(method, item, []) or ""
    following = _next_unpaired(calls, len(calls) - first, stream) if _holds(item, calls[first:]) else None
    if _holds(item, calls[:first]) or following == "held":  # an output made for an earlier item: only a buffer does that
        return (
            f"{method} holds the transform's outputs in a buffer before yielding them (a shuffle or prefetch buffer: the "
            "item it yields was made by the transform for an earlier item), so a cached value cannot be put back in its "
            "place and the cache cannot stand in for the stages before the buffer, which reorders and holds samples; only "
            "finished samples are cached (the sample point). To measure each stage, put the buffer before the stages: "
            "shuffle the raw items in the source, `self.stages = fastpipe.stages.Stages(source=<shuffled raw items>, "
            "transforms=[<each step>, ...])`, and yield each output as it comes (`return iter(self.stages)`); a buffer of "
            "raw (encoded) items also holds less memory than one of decoded samples"
        )
    if following == "count":
        # the transform ran another number of times than there are items: a buffer filling, or a filter dropping
        # items after the transform; the counts alone cannot tell which, so the text names both
        return (
            f"{method} does not yield one item per transform call (the transform ran more or fewer times than items "
            "came out: a buffer between the transform and the yield, such as a shuffle or prefetch buffer, or a filter "
            "that drops items after the transform), so a cached value cannot be paired with the item it belongs in and "
            "the cache cannot stand in for the stages before that step; only finished samples are cached (the sample "
            "point). To measure each stage, do the buffering or filtering before the stages, on the raw items: "
            "`self.stages = fastpipe.stages.Stages(source=<buffered or filtered raw items>, transforms=[<each step>, ...])`, "
            "and yield each output as it comes (`return iter(self.stages)`)"
        )
    return (
        f"{method} changes its transform's output before yielding it (e.g. `yield self.transform(x).float(), y`), so a "
        "cached value cannot be put back in its place; to get this point, make that last step the transform's final "
        "stage (for a fastpipe.stages.Stages(source=...), the last of its transforms=[...])"
    )


def _holds(item: Any, calls: list[_Call]) -> bool:
    """Whether ``item`` holds (by identity) the output of any of ``calls``."""
    return any(_locate_all(item, call.output) for call in calls)


def _next_unpaired(calls: list[_Call], per_item: int, stream: Iterator[Any]) -> str | None:
    """Reads one more item: "held" when it holds the output of a call made before it was asked for (a buffer: it
    fills with many calls, then takes one an item), "count" when it took another number of calls than the item before
    (``per_item``: a buffer, or a filter dropping items after the transform), None when it pairs like the first (a
    stream that changes one of two views makes two calls for every item) or cannot be read."""
    first = len(calls)  # ``calls`` is the recorder's own list: the next item's calls are appended to it
    try:
        following = next(stream)
    except Exception:  # noqa: BLE001  (an end or an error of the next item tells nothing about pairing: no buffer shown)
        return None
    if _holds(following, calls[:first]):
        return "held"
    return "count" if len(calls) - first != per_item else None


def _cycle(items: list[Any]) -> Iterator[Any]:
    while items:
        yield from items


def _close(stream: Iterator[Any]) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        close()


def probe_stream_point(dataset: Any, pipeline: TransformPipeline | None, point: str, *, timeout: float | None = None) -> PointProbe:
    """:func:`fastpipe.diagnosis.ladder._serve.probe_point` for a stream: one item captured in this process (no worker, so
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
    ``with_epoch(n)`` limits the whole chain's items (batches, when it batches), not the shard read's samples, and
    the passes over the shards repeat around the whole timed chain, ending after one that yields nothing
    (:func:`chain_passes`), as ``DataPipeline.iterator`` ends them.
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
            began = ledger.read()
            try:
                item = next(source)
            except StopIteration:
                return
            except StageError:
                raise
            except Exception as exc:
                raise StageError.wrap(RAW_STAGE, exc) from exc
            ledger.end_sample(*(b - a for a, b in zip(began, ledger.read())))
            yield item

    def _timed_chain(self) -> Iterator[Any]:
        assert self.pipeline is not None
        pipeline, shards = self.pipeline, cut_chain(self.dataset, self.pipeline, 0, once=True)

        def one_pass() -> Iterator[Any]:  # one read of the shards through the whole timed chain
            stream: Iterator[Any] = _Timed(RAW_STAGE, None, self.ledger, raw=True)(iter(shards))
            for stage in pipeline.stages:
                stream = _Timed(stage.name, stage.transform, self.ledger)(stream)
            return stream

        return chain_passes(self.dataset, one_pass)  # the user's passes and epoch, as DataPipeline.__iter__ runs them


class _Timed:
    """One step of a chain, timed: its own time per item is the time its ``next`` took less its upstream's."""

    def __init__(
        self, name: str, step: Callable[[Iterator[Any]], Iterator[Any]] | None, ledger: Callable[[], Any], raw: bool = False
    ) -> None:
        self.name, self.step, self.ledger, self.raw = name, step, ledger, raw
        self.upstream = [0.0, 0.0, 0.0, 0.0]

    def _feed(self, source: Iterator[Any]) -> Iterator[Any]:
        """The upstream as the step sees it, its time counted (to be taken off the step's)."""
        ledger = self.ledger()
        while True:
            began = ledger.read()
            try:
                item = next(source)
            except StopIteration:
                return
            self.upstream = [u + b - a for u, a, b in zip(self.upstream, began, ledger.read())]
            yield item

    def __call__(self, source: Iterator[Any]) -> Iterator[Any]:
        ledger = self.ledger()
        inner = source if self.step is None else iter(self.step(self._feed(source)))
        while True:
            self.upstream = [0.0, 0.0, 0.0, 0.0]
            began = ledger.read()
            try:
                item = next(inner)
            except StopIteration:
                return
            except StageError:
                raise
            except Exception as exc:
                raise StageError.wrap(self.name, exc) from exc
            spent = (b - a - u for a, b, u in zip(began, ledger.read(), self.upstream))
            ledger.pending.add(self.name, *(max(0.0, v) for v in spent))
            if self.raw:
                ledger.pending.samples += 1
            yield item
