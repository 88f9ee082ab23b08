"""What a few file headers say about the dataset's images: their typical size, and how many are progressive JPEGs.

The decode remedies depend on the files, not only on the transform: DCT scaling pays only on images at least twice
the output, and a progressive JPEG decodes several times slower than a baseline one (``fastpipe prepare`` rewrites
it). These probes read a bounded prefix of a few paths the dataset lists, so that advice never reads a whole file,
and never opens what is not a path.
"""

from __future__ import annotations

import statistics

from fastpipe.diagnosis.verdict._remedies._base import Advice


def samples_of(dataset: object | None) -> list[object]:
    """The (path, label) samples (or paths) of the image folder the dataset reads, through the wrappers that keep it as
    ``.dataset`` (Subset, most user wrappers) and the readers that hold its file list (timm's ImageDataset keeps it in
    ``.reader.samples``); torchvision's ``samples`` or ``imgs``. Empty when the dataset lists no files."""
    for _ in range(4):
        for holder in (dataset, getattr(dataset, "reader", None)):
            for attr in ("samples", "imgs"):
                found = getattr(holder, attr, None) if holder is not None else None
                if isinstance(found, (list, tuple)) and found:
                    return list(found)
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            break
    return []


def typical_size(dataset: object | None, image_size: tuple[int, int] | None, probe: int = 8) -> tuple[int, int] | None:
    """(height, width) of a typical raw image: given, or the median of a few headers of the files the dataset reads
    (:func:`samples_of`)."""
    if image_size is not None:
        return image_size
    samples = samples_of(dataset)
    if not samples:
        return None
    from PIL import Image

    sizes = []
    for sample in samples[:probe]:
        path = sample[0] if isinstance(sample, (list, tuple)) else sample
        try:
            with Image.open(path) as img:  # reads the header only
                sizes.append((img.height, img.width))
        except (OSError, TypeError, ValueError):
            continue
    if not sizes:
        return None
    return int(statistics.median(h for h, _ in sizes)), int(statistics.median(w for _, w in sizes))


#: How much of each file the progressive probe reads: the frame header follows the APPn segments (EXIF, ICC), which
#: rarely reach this far; a file whose header lies beyond it is not counted as probed.
HEADER_PROBE_BYTES = 256 * 1024


def progressive(dataset: object | None, probe: int = 16) -> tuple[int, int]:
    """(progressive JPEGs, JPEG files probed) among the first ``probe`` samples of an ImageFolder-like dataset.

    Reads at most :data:`HEADER_PROBE_BYTES` of each file (a shard or a huge file is not read whole) and only paths
    (a str or ``os.PathLike``: an int would be taken by ``open`` as one of the process's file descriptors and closed).
    """
    samples = samples_of(dataset)
    if not samples:
        return 0, 0
    import os

    import torch

    from fastpipe.ops.jpeg import is_jpeg, is_progressive, sof_offset

    found = probed = 0
    for sample in samples[:probe]:
        path = sample[0] if isinstance(sample, (list, tuple)) and sample else sample
        if not isinstance(path, (str, os.PathLike)):
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_PROBE_BYTES)
        except (OSError, ValueError):
            continue
        data = torch.frombuffer(bytearray(head), dtype=torch.uint8) if head else torch.empty(0, dtype=torch.uint8)
        if not is_jpeg(data) or sof_offset(head) is None:
            continue
        probed += 1
        found += is_progressive(data)
    return found, probed


def prepare_line(found: int, probed: int) -> str:
    """What the progressive probe found, as advice (empty when nothing was probed)."""
    if found:
        return (
            f" {found} of {probed} files probed are progressive JPEGs, several times slower to decode than baseline: "
            "`fastpipe prepare ROOT NEW_ROOT` copies the folder with them rewritten losslessly as baseline (pixels identical), "
            "the rest hard-linked; train on NEW_ROOT."
        )
    if probed:
        return f" None of the {probed} files probed is a progressive JPEG, so `fastpipe prepare` would not make them faster."
    return ""


def with_prepare(advice: Advice, dataset: object | None) -> Advice:
    """Add ``fastpipe prepare`` where the folder has progressive JPEGs (several times slower to decode than baseline)."""
    found, probed = progressive(dataset)
    if not found:
        return advice
    return Advice(summary=advice.summary + prepare_line(found, probed), snippet=advice.snippet, caveat=advice.caveat)
