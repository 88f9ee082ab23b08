"""The diagnosis plan: which cache points a pipeline allows, in order, and what lies between them.

Points run from the device upwards (most cached first)::

    device  one batch on the device, the step (and any device transform) repeated: the device bound
    host    one batch on the host, copied every step as the user's loop copies it
    sample  one finished sample per worker (a stream's first items, replayed); collate, IPC, pinning and the copy still run
    after:S the output of transform stage S; later stages rerun (last stage to first)
    raw     the transform's input; every transform reruns
    baseline nothing cached

``components[i]`` is what runs between ``points[i]`` and ``points[i + 1]``: the time a step
gains between those two points is that component's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastpipe.diagnosis.ladder._cachepoint import BASELINE, DEVICE, HOST, RAW, SAMPLE, CachePoint
from fastpipe.diagnosis.ladder._results import Unavailable
from fastpipe.stages import RAW_STAGE, TransformPipeline

COPY, COLLATE = "host-to-device copy", "collate/IPC"
SPAN = "span"
HAND_OVER = "hand-over"
"""The ThreadLoader's hand-over of decoded batches to the loop: what stands where a DataLoader has collate/IPC."""
"""The kind of a span that merges several kinds of component (measured points left out between them)."""


def point_label(point: str) -> str:
    """How the report names a cache point (:attr:`CachePoint.label`)."""
    return CachePoint(point).label


@dataclass
class Plan:
    points: list[CachePoint]
    components: list[str]
    unavailable: list[Unavailable] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.points = [CachePoint(p) for p in self.points]

    def between(self, upper: str, lower: str) -> list[str]:
        """The components between two points (several when points between them were not measured)."""
        return self.components[self.points.index(upper) : self.points.index(lower)]

    def without_copy(self) -> None:
        """Take the host point and the host-to-device copy out (a device with no copy, :func:`has_copy`): there the host
        point is the device point measured twice, and its difference a stage that does not exist."""
        if HOST in self.points and self.components and self.components[0] == COPY:
            self.points.remove(HOST)
            del self.components[0]

    def drop(self, point: str, reason: str, label: str | None = None) -> None:
        """Take ``point`` out (it cannot be built): its two neighbouring components merge into one span, named ``label``
        where the loader knows better what runs there (a ThreadLoader hands batches over; it has no collate/IPC)."""
        if point not in self.points or point in (DEVICE, BASELINE):
            return
        i = self.points.index(point)
        merged = label or (f"{self.components[i]} + {self.components[i - 1]}" if i > 0 else self.components[i])
        self.components[i - 1 : i + 1] = [merged]
        self.points.remove(point)
        self.unavailable.append(Unavailable(point, reason))


NO_COPY_KINDS = ("cpu",)
"""Device kinds whose step reads its batches where the loader leaves them: no host-to-device copy (``cpu``: the
tensors' ``.to(device)`` returns them as they are)."""


def has_copy(device_kind: str) -> bool:
    """Whether batches are copied to a device of this kind (``Device.kind``; script mode's ScriptDevice keeps it)."""
    return device_kind not in NO_COPY_KINDS


def make_plan(pipeline: TransformPipeline | None, why_not: str | None) -> Plan:
    """The points and components for a dataset's located pipeline (or the reason there is none)."""
    points, unavailable = [DEVICE, HOST], []
    components = [COPY]
    if pipeline is None:
        reason = why_not or "no transform"
        points.append(SAMPLE)  # finished samples can always be cached: by index, or in each worker of a stream
        components += [COLLATE, f"{RAW_STAGE} + transforms"]
        unavailable += [Unavailable("after:<stage>", reason), Unavailable(RAW, reason)]
    else:
        names = pipeline.names()
        points.append(SAMPLE)
        components.append(COLLATE)
        points += [CachePoint.after(name) for name in reversed(names[:-1])]
        components += list(reversed(names))
        if names:
            points.append(RAW)
            components.append(RAW_STAGE)
        else:  # with no stages, the raw sample is the finished sample
            components.append(RAW_STAGE)
            unavailable += [Unavailable("after:<stage>", "the transform has no stages"), Unavailable(RAW, "the transform has no stages")]
    points.append(BASELINE)
    return Plan(points, components, unavailable)


def kind_of(components: list[str]) -> str:
    """One component's kind, or ``span`` for a merge of several kinds (never "a transform" when raw load is in it)."""
    parts = [part for c in components for part in c.split(" + ")]
    kinds = {_part_kind(part) for part in parts}
    return kinds.pop() if len(kinds) == 1 else SPAN


def _part_kind(part: str) -> str:
    if part == RAW_STAGE:
        return "raw load"
    if part == COLLATE:
        return COLLATE
    if part == COPY:
        return COPY
    if part == HAND_OVER:
        return HAND_OVER
    return "transform"
