"""What to do about a slow stage: its own remedy, fastpipe's drop-in for it, and when that cannot help.

A diagnosis that says "make it cheaper" leaves the user where they started. :func:`recommend`
names the remedy that fits the stage that was found (cropping is not sped up by a compiled
kernel; a Python pixel loop is), gives a snippet that runs against fastpipe's real API, and
says when a drop-in cannot pay off (DCT scaling on images smaller than twice the output).

What a transform is comes from the transform catalog alone
(:func:`~fastpipe.diagnosis.discovery._catalog.facts_for`), never from its class name. This module routes a stage to
its remedy; the remedies live in :mod:`fastpipe.diagnosis.verdict._remedies`, one concern a module, and the names
other modules use are re-exported here.
"""

from __future__ import annotations

from typing import Callable

from fastpipe.diagnosis.ladder._plan import HAND_OVER
from fastpipe.diagnosis.verdict._loader import LoaderFacts
from fastpipe.diagnosis.verdict._remedies._base import COLLATE, COPY, RAW, TRANSFORM, WORKERS, Advice
from fastpipe.diagnosis.verdict._remedies._batches import collate, host_copy, recommend_loader_stage, workers
from fastpipe.diagnosis.verdict._remedies._decode import raw_load
from fastpipe.diagnosis.verdict._remedies._pipeline import base_name, ships_uint8
from fastpipe.diagnosis.verdict._remedies._probes import HEADER_PROBE_BYTES, samples_of, with_prepare
from fastpipe.diagnosis.verdict._remedies._stream import ShardList, webdataset_shards
from fastpipe.diagnosis.verdict._remedies._transforms import transform as transform_advice

__all__ = [
    "COLLATE",
    "COPY",
    "HEADER_PROBE_BYTES",
    "RAW",
    "TRANSFORM",
    "WORKERS",
    "Advice",
    "ShardList",
    "recommend",
    "recommend_loader_stage",
    "samples_of",
    "ships_uint8",
    "webdataset_shards",
]


def recommend(
    stage: str,
    kind: str,
    *,
    transform: object | None = None,
    dataset: object | None = None,
    image_size: tuple[int, int] | None = None,
    loader: LoaderFacts | None = None,
) -> Advice:
    """The remedy for ``stage``, a stage name as a diagnosis reports it.

    Args:
        stage: e.g. ``"RandomResizedCrop"``, ``"raw load"``, ``"collate/IPC"``, or a span measured as one
            (``"raw load + PILToTensor + collate/IPC"``), which is advised as a span, never as a transform.
        kind: ``"raw load"``, ``"transform"``, ``"collate/IPC"``, ``"host-to-device copy"`` or ``"too few workers"``.
        transform: the dataset's transform (a Compose, a list of its stages, or the stage itself): the stage named is
            found in it, and its facts decide the remedy; it gives the output size, mean and std for the snippet, and
            shows whether a crop runs after the conversion to a tensor. A stage it does not hold is known by name alone.
        dataset: the dataset; an ImageFolder-like one (``samples`` of (path, label)), or a wrapper holding
            one as ``.dataset``, lets a few image headers be read to say whether DCT scaling can help.
        image_size: (height, width) of a typical raw image, when the caller knows it.
        loader: what the device and the loader already do (:class:`~fastpipe.diagnosis.verdict._loader.LoaderFacts`):
            no copy advice where the device has no copy, and no advice to do what the loader already does.
    """
    loader = loader or LoaderFacts()
    parts = [part.strip() for part in stage.split(" + ") if part.strip()]
    if len(parts) > 1:
        return _span(parts, transform, dataset, image_size, loader)
    name = parts[0] if parts else stage
    base = base_name(name)
    if kind == WORKERS:
        return workers()
    if base == RAW or kind == RAW:
        return with_prepare(raw_load(transform, dataset, image_size, loader.copies), dataset)
    if base == COLLATE or kind == COLLATE:
        return collate(transform, dataset, loader)
    if base == COPY or kind == COPY:
        return host_copy(transform, loader)
    return transform_advice(name, transform, dataset, image_size, loader)


def _span(
    parts: list[str], transform: object | None, dataset: object | None, image_size: tuple[int, int] | None, loader: LoaderFacts
) -> Advice:
    """Stages measured together (an interrupted or bisected run): which part costs the time is not known."""
    kinds: dict[str, Callable[[], Advice]] = {
        RAW: lambda: raw_load(transform, dataset, image_size, loader.copies),
        COLLATE: lambda: collate(transform, dataset, loader),
        COPY: lambda: host_copy(transform, loader),
        HAND_OVER: lambda: Advice(
            summary="hand-over: the ThreadLoader giving decoded batches to the loop (ring views and buffer release), not a "
            "transform; its own clocks time it with the loader's other stages."
        ),
    }
    advice = [kinds[p]() if p in kinds else transform_advice(p, transform, dataset, image_size, loader) for p in parts]
    first = next((a for a in advice if a.snippet is not None), None)
    remedies = " ".join(a.summary for a in advice)
    return Advice(
        summary=(
            f"{' + '.join(parts)} were measured as one span, so their time is not split between them: "
            f"`fastpipe costs SPEC` times each inside the workers. The remedies, part by part: {remedies}"
        ),
        snippet=None if first is None else first.snippet,
        caveat="; ".join(a.caveat for a in advice if a.caveat) or None,
    )
