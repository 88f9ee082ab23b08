"""Cache points: dataset wrappers that replay one stage's output inside the DataLoader workers.

A :class:`CachePointDataset` wraps the user's dataset (never modifying it) and, in each worker
process, captures ``pool`` real samples at one point of the pipeline, then serves every later
index from that capture, rerunning only the stages after the point:

* ``sample``: the finished sample is served as-is; collate, IPC, pinning and the copy still run;
* ``after:<Stage>``: that stage's output is cached, and the later stages rerun;
* ``raw``: the transform's input is cached, and every transform reruns;
* ``baseline``: nothing is cached; stages run through :class:`~fastpipe.stages.TransformPipeline`
  so a failure names its stage.

A dataset that calls its transform more than once per sample (two views, as in SimCLR) has
each call cached and rerun, so the repeated cost stays with the transform; the capture counts
the calls (``calls_per_sample``).

Cached values are handed to the later stages as copies, so in-place transforms such as
RandomMask cannot pile up over steps, unless the capture shows the later stages leave the value
untouched: then it is served without a copy, guarded by the tensors' version counters (an
in-place write found later switches that value back to copies). NumPy arrays have no version
counter and are always copied; PIL images are never copied (torchvision treats them as
immutable). Each dataset times its own copies inside the workers into a shared-memory ledger,
read in the main process with :meth:`CachePointDataset.copy_seconds_per_sample`.

A point that cannot be built raises :class:`UnavailablePoint` (catchable, also when re-raised
from a worker); :func:`~fastpipe.diagnosis.ladder._serve.check_point` finds that out in the main process before any worker starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from fastpipe.diagnosis.ladder._cachepoint import BASELINE, RAW, CachePoint
from fastpipe.stages import StageError, TransformPipeline, current_part, read_sample

_UNNEST = object()
"""Path marker: ``__getitem__`` returned the transform's batch-of-one dict unnested (Hugging Face datasets)."""
MAX_WORKERS = 256


def fresh_copy(value: Any) -> Any:
    """A copy of ``value`` that transforms cannot mutate the cache through, laid out as the original.

    The next stage must get what the pipeline gives it, or the cache point changes the work below it: a
    tensor keeps its subclass (torchvision's ``tv_tensors``), dtype, shape, strides and storage offset, also
    when it is a view into a larger image (a crop), and stays in shared memory when it was there; an array keeps
    its memory order. (``Tensor.clone()`` makes a non-dense view contiguous; ``ndarray.copy()`` makes C order.)
    """
    if isinstance(value, torch.Tensor):
        return _same_layout_copy(value)
    if isinstance(value, np.ndarray):
        return value.copy(order="K") if value.flags.c_contiguous or value.flags.f_contiguous else _same_layout_array(value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(fresh_copy(item) for item in value)
    if isinstance(value, dict):
        return type(value)((key, fresh_copy(item)) for key, item in value.items())
    return value


def _same_layout_copy(value: torch.Tensor) -> torch.Tensor:
    """A private copy of the storage span ``value`` views, viewed with its own size, strides and offset."""
    if value.numel() == 0 or any(st < 0 for st in value.stride()):
        copied = value.clone()
    else:
        extent = 1 + sum((n - 1) * st for n, st in zip(value.shape, value.stride()))
        span = value.as_strided((extent,), (1,))  # the elements from the view's first to its last, as one row
        flat = torch.empty(extent + value.storage_offset(), dtype=value.dtype, device=value.device)
        flat[value.storage_offset() :].copy_(span)
        copied = flat.as_strided(value.shape, value.stride(), value.storage_offset())
        if value.is_shared() and not copied.is_shared():
            copied.share_memory_()
    if type(value) is not torch.Tensor:
        copied = copied.as_subclass(type(value))
    return copied.requires_grad_(value.requires_grad) if value.is_leaf else copied


def _same_layout_array(value: np.ndarray) -> np.ndarray:
    """A copy of a non-contiguous array with the same strides (through torch; else the closest order NumPy keeps)."""
    try:
        return _same_layout_copy(torch.from_numpy(value)).numpy()
    except (TypeError, ValueError, RuntimeError):  # negative strides, a dtype torch lacks
        return value.copy(order="K")


class UnavailablePoint(Exception):
    """A cache point cannot be built for this dataset; the message names the point and says why.

    One string argument, so a DataLoader re-raises it from a worker as the same type; :attr:`point`
    and :attr:`reason` are read back from the message either way.
    """

    PREFIX = "[fastpipe unavailable point: "

    @classmethod
    def because(cls, point: str, reason: str) -> "UnavailablePoint":
        return cls(f"{cls.PREFIX}{point}] {reason}")

    @property
    def point(self) -> str | None:
        parsed = _parse_unavailable(str(self))
        return parsed[0] if parsed else None

    @property
    def reason(self) -> str:
        parsed = _parse_unavailable(str(self))
        return parsed[1] if parsed else str(self)


def _parse_unavailable(message: str) -> tuple[str, str] | None:
    start = message.find(UnavailablePoint.PREFIX)
    if start < 0:
        return None
    start += len(UnavailablePoint.PREFIX)
    end = message.find("] ", start)
    if end < 0:
        return None
    return message[start:end], message[end + 2 :].splitlines()[0]


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _versions(value: Any) -> list[int] | None:
    """The version counters of the tensors in ``value``; None when a leaf cannot be guarded (an array)."""
    versions = []
    for leaf in _leaves(value):
        if isinstance(leaf, np.ndarray):
            return None
        if isinstance(leaf, torch.Tensor):
            try:
                versions.append(leaf._version)
            except RuntimeError:  # inference-mode tensors keep no version counter
                return None
    return versions


def _same(value: Any, pristine: Any) -> bool:
    """Whether ``value`` still equals its pristine copy (tensors by content, other leaves by identity)."""
    a, b = _leaves(value), _leaves(pristine)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)):
                return False
        elif x is not y:
            return False
    return True


def _locate_all(sample: Any, target: Any) -> list[tuple[Any, ...]]:
    """Every index path at which ``target`` (by identity) sits inside ``sample``, depth first."""
    if sample is target:
        return [()]
    if isinstance(sample, (list, tuple)):
        items = list(enumerate(sample))
    elif isinstance(sample, dict):
        items = list(sample.items())
    else:
        return []
    return [(key, *found) for key, item in items for found in _locate_all(item, target)]


def _unnested_in(sample: Any, output: Any) -> bool:
    """``sample`` is ``output``'s first row (``{k: v[0]}``), as a Hugging Face dataset returns it."""
    if not (isinstance(sample, dict) and isinstance(output, dict) and output):
        return False
    try:
        return all(k in sample and len(v) == 1 and sample[k] is v[0] for k, v in output.items())
    except TypeError:
        return False


def _substitute(sample: Any, path: tuple[Any, ...], value: Any) -> Any:
    if path == (_UNNEST,):
        return {**sample, **{key: items[0] for key, items in value.items()}}
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(sample, dict):
        return type(sample)((k, _substitute(v, rest, value) if k == key else v) for k, v in sample.items())
    items = [_substitute(v, rest, value) if i == key else v for i, v in enumerate(sample)]
    return type(sample)(*items) if hasattr(sample, "_fields") else type(sample)(items)


@dataclass
class _Call:
    """One call of the transform during a capture."""

    part: int
    pristine: Any
    """A copy of the value at the point, taken before any later stage ran."""
    shared: Any
    """The value itself, when the later stages left it untouched (served without a copy), else None."""
    versions: list[int] | None
    output: Any


class _Recorder:
    """Stands in for the dataset's transform during capture: runs the real stages and keeps the value at the point.

    Counts its calls: a dataset calling its transform twice per sample (two views) is recorded twice.
    """

    def __init__(self, pipeline: TransformPipeline, cut: int, skip_copies: bool) -> None:
        self.pipeline, self.cut, self.skip_copies = pipeline, cut, skip_copies
        self.calls: list[_Call] = []

    def __call__(self, x: Any) -> Any:
        part = current_part()
        stages = self.pipeline.part(part)
        x = stages.run(x, 0, self.cut)
        pristine = fresh_copy(x)
        before = _versions(x) if self.skip_copies else None
        output = stages.run(x, self.cut)
        after = _versions(x) if before is not None else None
        untouched = before is not None and before == after and _same(x, pristine)
        self.calls.append(_Call(part, pristine, x if untouched else None, after if untouched else None, output))
        return output


@dataclass
class _View:
    path: tuple[Any, ...]
    part: int
    source: Any
    """The pristine value: copied for every sample unless ``shared`` is set."""
    shared: Any = None
    versions: list[int] | None = None

    def take(self) -> tuple[Any, bool]:
        """The value to run the later stages on, and whether it was copied."""
        if self.shared is not None and _versions(self.shared) == self.versions:
            return self.shared, False
        self.shared = None  # written to since the capture: copies from now on
        return fresh_copy(self.source), True

    def check(self) -> None:
        """After the later stages ran on the shared value: if they wrote to it, copy from now on."""
        if self.shared is not None and _versions(self.shared) != self.versions:
            self.shared = None


@dataclass
class _Entry:
    template: Any
    views: list[_View] = field(default_factory=list)


@dataclass
class _Capture:
    sample: Any
    calls: list[_Call]
    reason: str | None

    @property
    def cached(self) -> Any:
        """The value at the point from the first call of the transform (None at sample/baseline)."""
        return self.calls[0].pristine if self.calls else None


@dataclass(frozen=True)
class CopyStats:
    """The cache's own copies, over every process that served samples since the last reset."""

    samples: int
    """Samples served from the cache."""
    copied: int
    """Of those, samples whose cached values were copied (the rest were served without a copy)."""
    seconds: float
    """Time spent copying, in all."""

    @property
    def seconds_per_sample(self) -> float:
        return self.seconds / self.samples if self.samples else 0.0


class CachePointDataset(Dataset):
    """The user's dataset with data cached at one point; see the module docstring.

    Args:
        dataset: the loader's dataset (left untouched).
        pipeline: its located transform, or None when it has none (then only ``sample`` and ``baseline`` apply).
        point: ``"sample"``, ``"raw"``, ``"after:<Stage>"`` or ``"baseline"``.
        pool: how many different captures each worker keeps and cycles through.
        skip_copies: serve a cached value without copying it when the capture shows the later
            stages leave it untouched (guarded by version counters); False copies every time.
        clock: the timer for the copy ledger (tests pass a fake one).

    Raises:
        UnavailablePoint: the point names no stage, or needs a transform the dataset lacks;
            later, from ``__getitem__``, when the dataset changes its transform's output.
    """

    def __init__(
        self,
        dataset: Any,
        pipeline: TransformPipeline | None,
        point: str,
        pool: int = 1,
        *,
        skip_copies: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if pool < 1:
            raise ValueError(f"pool must be at least 1, got {pool}")
        self.dataset, self.pipeline, self.point, self.pool = dataset, pipeline, CachePoint(point), pool
        self.skip_copies, self.clock = skip_copies, clock
        self.cut = self._cut_index(self.point)
        self.calls_per_sample: int | None = None
        """How many times the dataset called its transform for one sample (set by this process's first capture)."""
        self._entries: dict[int, _Entry] = {}
        self._calls = 0
        self._staged: Any = None
        # one row per process (0: the main process, 1 + worker id), columns: samples, copied samples, seconds;
        # in shared memory, so the workers' rows are read in the main process (only points that copy need one)
        rows = MAX_WORKERS + 1 if self.cut is not None else 1
        self._copy_ledger = torch.zeros((rows, 3), dtype=torch.float64)
        if self.cut is not None:
            self._copy_ledger.share_memory_()
        self._ledger_rows: np.ndarray | None = None  # a NumPy view of the ledger, made in each process

    def _cut_index(self, point: CachePoint) -> int | None:
        if point.kind not in ("raw", "after"):
            return None
        if self.pipeline is None:
            raise UnavailablePoint.because(point, "the dataset has no transform to split")
        if point == RAW:
            return 0
        names = self.pipeline.names()
        if point.stage not in names:
            raise UnavailablePoint.because(point, f"no stage named {point.stage!r}; the stages are {names}")
        return names.index(point.stage) + 1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_entries"], state["_staged"], state["_calls"] = {}, None, 0  # captured again in each worker
        state["_ledger_rows"] = None  # pickling a view would copy it; the shared tensor travels instead
        return state

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if self.point == BASELINE:
            if self.pipeline is None:
                return read_sample(self.dataset, index)
            if self._staged is None:  # once, so state the dataset caches on itself (open files) persists
                self._staged = self.pipeline.with_transform(self.dataset, self.pipeline.run)
            return read_sample(self._staged, index)
        slot = self._calls % self.pool
        self._calls += 1
        entry = self._entries.get(slot)
        if entry is None:
            entry = self._entries[slot] = self._entry(index)
        return self._serve(entry)

    def _serve(self, entry: _Entry) -> Any:
        """One sample from a capture: the later stages rerun on (a copy of) each cached value, put back in place."""
        if self.cut is None:
            return entry.template
        assert self.pipeline is not None
        began = self.clock()
        taken = [view.take() for view in entry.views]
        seconds = self.clock() - began
        sample = entry.template
        for view, (value, _) in zip(entry.views, taken):
            output = self.pipeline.part(view.part).run(value, self.cut)
            view.check()
            sample = _substitute(sample, view.path, output)
        copied = any(was_copied for _, was_copied in taken)
        self._record(seconds if copied else 0.0, copied)
        return sample

    # ----- the copy ledger ----------------------------------------------------------------
    def _record(self, seconds: float, copied: bool, samples: int = 1) -> None:
        """One served item: ``samples`` is how many samples it holds (a stream cached after ``batched`` serves whole
        batches), so the ledger's time per sample is what attribution multiplies by the batch size."""
        if self._ledger_rows is None:
            self._ledger_rows = self._copy_ledger.numpy()  # 0.5 us an update instead of 17 with tensor indexing
        info = get_worker_info()
        row = self._ledger_rows[0 if info is None else 1 + info.id % MAX_WORKERS]
        row[0] += samples
        row[1] += samples if copied else 0
        row[2] += seconds

    def copy_stats(self) -> CopyStats:
        """The copies made by every process serving this dataset (workers included) since the last reset."""
        samples, copied, seconds = self._copy_ledger.sum(dim=0).tolist()
        return CopyStats(samples=int(samples), copied=int(copied), seconds=seconds)

    def copy_seconds_per_sample(self) -> float:
        """Seconds this cache spent copying per sample served (0.0 when it served none, or copied none)."""
        return self.copy_stats().seconds_per_sample

    def reset_copy_stats(self) -> None:
        self._copy_ledger.zero_()

    # ----- capture ------------------------------------------------------------------------
    def _entry(self, index: int) -> _Entry:
        capture = self._capture(index)
        if capture.reason is not None:
            raise UnavailablePoint.because(self.point, capture.reason)
        return _entry_from(capture, self.skip_copies)

    def _capture(self, index: int) -> _Capture:
        if self.cut is None:
            return _Capture(read_sample(self.dataset, index), [], None)
        recorder = _Recorder(self.pipeline, self.cut, self.skip_copies)
        sample = read_sample(self.pipeline.with_transform(self.dataset, recorder), index)
        self.calls_per_sample = len(recorder.calls)
        return _Capture(sample, recorder.calls, self._unplaceable(sample, recorder.calls))

    def _unplaceable(self, sample: Any, calls: list[_Call]) -> str | None:
        """Why the captured outputs cannot be put back in the sample, or None."""
        return unplaceable(f"{type(self.dataset).__name__}.__getitem__", sample, calls)


def unplaceable(method: str, sample: Any, calls: list[_Call]) -> str | None:
    """Why the transform outputs ``calls`` made cannot be put back in the ``sample`` that ``method`` returned, or None."""
    if not calls:
        return f"{method} did not call its transform for this sample, so there is nothing to cache"
    for call in calls:
        if not _locate_all(sample, call.output) and not _unnested_in(sample, call.output):
            return (
                f"{method} changes its transform's output before returning it (e.g. "
                "`return self.transform(img).float(), y`), so a cached value cannot be put back in its place; "
                "to get this point, make that last step the transform's final stage (e.g. append it to the Compose)"
            )
    return None


def _entry_from(capture: _Capture, skip_copies: bool) -> _Entry:
    entry = _Entry(template=capture.sample)
    used: set[tuple[Any, ...]] = set()
    for call in capture.calls:
        paths = [p for p in _locate_all(capture.sample, call.output) if p not in used]
        path = paths[0] if paths else (_UNNEST,)
        used.add(path)
        shared = call.shared if skip_copies else None
        entry.views.append(_View(path, call.part, call.pristine, shared, call.versions if shared is not None else None))
    return entry


@dataclass(frozen=True)
class PointProbe:
    """What one main-process capture says about a cache point."""

    point: str
    reason: str | None
    """Why the point is unavailable, or None when it can be built."""
    calls_per_sample: int | None
    """How many times the dataset called its transform for the sample (2 for two views); None for sample/baseline."""
    copies: bool
    """Whether the cached values must be copied for every sample (False: later stages leave them untouched)."""


def capture_value(dataset: Any, pipeline: TransformPipeline, point: str, index: int = 0) -> Any:
    """The value ``point`` caches for sample ``index`` (the first view's), read in this process: e.g. the raw
    input at ``"raw"``, to look at input sizes. Raises UnavailablePoint for a point with no such value."""
    cached = CachePointDataset(dataset, pipeline, point)
    if cached.cut is None:
        raise UnavailablePoint.because(point, "it caches finished samples, not a value inside the pipeline")
    capture = cached._capture(index)
    if not capture.calls:
        raise UnavailablePoint.because(point, capture.reason or "the transform was not called")
    return capture.cached


def stage_of_error(exc: BaseException) -> str | None:
    """The pipeline stage a worker error came from, if fastpipe labelled it."""
    return StageError.stage_of(str(exc))
