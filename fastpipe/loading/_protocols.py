"""The hooks a loader may declare so that fastpipe's loops and the diagnosis can use it: declared, never probed.

A plain ``torch.utils.data.DataLoader`` needs none of these. A loader of another class (``fastpipe.loading.recycled``'s
:class:`RecycledLoader`, the Ray :class:`RayLoader`, a user's own) implements the ones that apply, and the
diagnosis checks them with ``isinstance`` against these runtime-checkable protocols (as torchtnt declares its
``Callback`` hooks and SPDL its ``TaskHook``).
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, TypedDict, runtime_checkable


@runtime_checkable
class RebuildsAroundDataset(Protocol):
    """A loader that can rebuild itself, every setting kept, around another dataset: how cache points reach it."""

    dataset: Any

    def with_dataset(self, dataset: Any, **overrides: Any) -> Any:
        """A new loader like this one, over ``dataset``; ``overrides`` replace settings (e.g. ``num_workers``)."""


@runtime_checkable
class StagesOutsideWorkers(Protocol):
    """A loader whose stages run outside DataLoader workers (e.g. in Ray tasks): only some cache points apply."""

    @property
    def unsupported_point_reason(self) -> str:
        """Why the per-stage points cannot be served; the report gives it for each point left out."""


@runtime_checkable
class PinsForDevice(Protocol):
    """A loader that pins (or registers) its own batch memory for a device, so fastpipe must not pin again."""

    def iter_for_device(self, device: Any) -> Iterator[Any]:
        """Batches ready for a non-blocking copy to ``device``."""


class LoaderStats(TypedDict, total=False):
    """What a loader that counts its own work reports (``RecycledLoader.stats()``)."""

    batches: int
    reused: int
    fallbacks: int
    grown: int
    kept: int
    released: int
    slots: int
    workers: int
    ring_bytes: int
    pinning: str


@runtime_checkable
class ReportsStats(Protocol):
    """A loader with counters of its own, put into the diagnosis report after the baseline point."""

    def stats(self) -> LoaderStats:
        """Counts since the loader was made."""


class _StageClockOptional(TypedDict, total=False):
    """StageClock's optional keys (a base with ``total=False``: ``typing.NotRequired`` is not in Python 3.10)."""

    busy_seconds: float


class StageClock(_StageClockOptional):
    """One stage of a loader that times itself: running totals since the loader was made (differenced by the reader).

    ``thread`` names whose time ``seconds`` is: the wall time of that thread, or for a stage run by several native
    threads (the ThreadLoader's decode), their seconds summed and divided by the threads it has, the time the stage
    takes of that many cores. Stages on different threads overlap, so their times do not add up to the loop's.
    ``items`` are the images the stage handled, ``calls`` the batches, and ``threads`` the threads each call had,
    summed over the calls (``threads / calls``: the mean; 1 for a plain Python thread). ``busy_seconds``, where given,
    is the wall time during which the stage ran at all: ``seconds * threads / calls / busy_seconds`` threads worked at
    once on average.
    """

    stage: str
    thread: str
    what: str
    seconds: float
    items: int
    calls: int
    threads: int


class StageClocks(TypedDict):
    """Every stage's :class:`StageClock`, in pipeline order, and what reached the loop: ``images`` in ``batches``."""

    stages: list[StageClock]
    images: int
    batches: int


@runtime_checkable
class TimesOwnStages(Protocol):
    """A loader without DataLoader workers that times its own stages (the ThreadLoader's reading, decoding and loop
    threads). The diagnosis reads the clocks when the baseline point's warm-up ends and after each timed step, and
    reports the difference as the loader's stage costs, where a DataLoader's would be timed inside its workers."""

    def stage_clocks(self) -> StageClocks:
        """Running totals since the loader was made; cheap enough to read after every step."""


@runtime_checkable
class BatchesWhole(Protocol):
    """A loader that makes whole batches at once (the ThreadLoader's batch decode): no sample exists apart from its
    batch, so a cache of finished samples, served one at a time and collated, would time a path the loader never runs."""

    @property
    def batches_whole(self) -> str | None:
        """Why the sample point does not stand for this loader, or None when it serves samples one by one after all."""


def batches_whole(loader: Any) -> str | None:
    """Why a loader's sample point would time another path than its own (see :class:`BatchesWhole`), or None."""
    return loader.batches_whole if isinstance(loader, BatchesWhole) else None


def stages_outside_workers(loader: Any) -> str | None:
    """The reason a loader's stages cannot be cached per stage, or None for a loader whose stages run in workers."""
    return loader.unsupported_point_reason if isinstance(loader, StagesOutsideWorkers) else None


@runtime_checkable
class WrapsLoader(Protocol):
    """A loader that wraps another and adds work on the device (a prefetcher that normalises after its copy, say).

    fastpipe diagnoses the loader inside (it rebuilds it around cached datasets) and runs ``wrapped_device_transform``
    after its own copy, so the model sees what the wrapper would have given it (see :mod:`fastpipe.loading._unwrap`).
    """

    @property
    def wrapped_loader(self) -> Any:
        """The loader this one iterates (a DataLoader, or another loader fastpipe can unwrap or rebuild)."""

    @property
    def wrapped_device_transform(self) -> Any:
        """``batch -> batch`` the wrapper runs on the device after its copy, or None."""
