"""Cache points, named by a type: where along the pipeline a diagnosis caches the data.

From the device upwards (most cached first): ``device`` (one batch on the device: the bound), ``host`` (one batch
on the host, copied every step), ``sample`` (one finished sample per worker), ``after:<Stage>`` (a transform
stage's output), ``raw`` (the transform's input) and ``baseline`` (nothing cached).

A :class:`CachePoint` is a ``str`` so that reports, JSON and dict keys keep the plain names users read
(``"after:RandomMask"``); every parse of those names happens here, nowhere else.
"""

from __future__ import annotations

KINDS = ("device", "host", "sample", "after", "raw", "baseline")
_AFTER = "after:"


class CachePoint(str):
    """One cache point's name, checked when made; ``kind``, ``stage`` and ``label`` read it."""

    def __new__(cls, name: str) -> "CachePoint":
        if isinstance(name, CachePoint):
            return name
        kind = "after" if name.startswith(_AFTER) else name
        if kind not in KINDS or (kind == "after" and len(name) == len(_AFTER)):
            raise ValueError(f"not a cache point: {name!r} (one of device, host, sample, after:<Stage>, raw, baseline)")
        return super().__new__(cls, name)

    @classmethod
    def after(cls, stage: str) -> "CachePoint":
        """The point that caches the output of transform stage ``stage``."""
        return cls(_AFTER + stage)

    @property
    def kind(self) -> str:
        """``device``, ``host``, ``sample``, ``after``, ``raw`` or ``baseline``."""
        return "after" if self.startswith(_AFTER) else str(self)

    @property
    def stage(self) -> str | None:
        """The stage whose output an ``after:`` point caches; None for the other kinds."""
        return self[len(_AFTER) :] if self.kind == "after" else None

    @property
    def caches_stage_output(self) -> bool:
        """True for ``after:<Stage>`` and ``raw``: points served inside the workers by replaying a stage's output."""
        return self.kind in ("after", "raw")

    @property
    def outside_workers(self) -> bool:
        """True for ``device`` and ``host``: cached batches feed the loop directly, no loader runs."""
        return self.kind in ("device", "host")

    @property
    def label(self) -> str:
        """How the report names the point (``device (bound)``, ``after RandomMask``)."""
        if self.kind == "device":
            return "device (bound)"
        return f"after {self.stage}" if self.kind == "after" else str(self)


DEVICE = CachePoint("device")
HOST = CachePoint("host")
SAMPLE = CachePoint("sample")
RAW = CachePoint("raw")
BASELINE = CachePoint("baseline")
ANCHORS = (DEVICE, HOST, BASELINE)
"""Points every loader allows: a diagnosis cannot go on without them."""
