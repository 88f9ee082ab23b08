"""``prepare_folder``: a copy of an image folder with its progressive JPEGs rewritten as baseline, losslessly.

Why: a progressive JPEG must have every scan entropy-decoded, over the whole image, before any
pixel of a crop exists, so decode-and-crop cannot skip or stop early on it: such files cost
several times a baseline file (``benchmarks/bench_jpeg.py`` splits them). Rewriting one as
baseline from its own quantised DCT coefficients (``fastpipe::_jpeg_to_baseline``, libjpeg's
transcoding path, as ``jpegtran``) changes only the entropy coding: the decoded pixels are the
same bit for bit (``tests/test_prepare.py`` checks it), and the labels and folder layout are kept.
Every other file is hard-linked (copied where links cannot be made). Optional to use: the
training code is unchanged, only ``root`` points at the prepared folder.

Restart markers (``restart_rows``) are offered for measurement only: they would let a decoder
resynchronise mid-scan, but libjpeg-turbo turns off its fast Huffman path when they are present,
so they are off by default; keep them only where ``benchmarks/bench_jpeg.py`` shows a gain.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fastpipe.datasets.crop import crop_params
from fastpipe.errors import ConfigError, CorruptImageError
from fastpipe.ops import jpeg as jpeg_ops


def to_baseline(data: torch.Tensor, restart_rows: int = 0) -> torch.Tensor:
    """The JPEG in ``data`` rewritten as baseline from its DCT coefficients (pixels identical); its bytes.

    Raises DecompressionBombError (a CorruptImageError) for a header over :func:`fastpipe.ops.jpeg.max_image_pixels`,
    checked before libjpeg allocates anything, as the decode ops check it.
    """
    jpeg_ops.require_jpeg_op()
    jpeg_ops.jpeg_size(data)  # the pixel limit, first
    try:
        return torch.ops.fastpipe._jpeg_to_baseline(data, int(restart_rows))
    except RuntimeError as exc:
        raise CorruptImageError(str(exc).split("\n")[0]) from None


@dataclass
class PrepareReport:
    """What :func:`prepare_folder` did, and what it bought on the files it changed (one thread, same boxes)."""

    files: int
    changed: int
    linked: int
    copied: int
    bytes_before: int
    bytes_after: int
    ms_before: float | None
    ms_after: float | None
    timed: int = 0  # rewritten files the times were measured on (the first ``sample``)

    def summary(self) -> str:
        line = (
            f"{self.changed} of {self.files} files rewritten (progressive -> baseline, pixels identical), "
            f"{self.linked} linked, {self.copied} copied; rewritten files {self.bytes_before / 1e6:.1f} MB -> {self.bytes_after / 1e6:.1f} MB"
        )
        if self.ms_before is not None and self.ms_after is not None:
            line += (
                f"; decode-and-crop on {self.timed} of them {self.ms_before:.3f} -> {self.ms_after:.3f} ms per image "
                f"({self.ms_before / self.ms_after:.2f}x faster)"
            )
        return line


#: Rewritten files kept in memory to time before and after (enough for a stable per-image figure).
SAMPLE = 64


def _place(source: Path, target: Path) -> str:
    try:
        os.link(source, target)
        return "linked"
    except OSError:
        shutil.copy2(source, target)
        return "copied"


def _time_per_image(datas: list[torch.Tensor], boxes: list[tuple[int, int, int, int]], size: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for data, box in zip(datas, boxes):
            jpeg_ops.decode_jpeg_crop(data, box, (size, size))
        best = min(best, time.thread_time() - start)
    return best * 1e3 / max(len(datas), 1)


def prepare_folder(
    source: "str | os.PathLike[str]",
    target: "str | os.PathLike[str]",
    *,
    restart_rows: int = 0,
    measure: bool = True,
    size: int = 224,
    sample: int = SAMPLE,
) -> PrepareReport:
    """Copy ``source`` to ``target`` (a new folder), progressive JPEGs rewritten as baseline, the rest hard-linked.

    ``measure``: time decode-and-crop (``size``, the same seeded RandomResizedCrop boxes before and after, best
    of 3 rounds of thread CPU time) on the first ``sample`` rewritten files, for the report: only those are kept in
    memory, so a folder of any size is prepared in bounded memory.
    """
    source, target = Path(source), Path(target)
    if not source.is_dir():
        raise ConfigError(f"prepare: {source} is not a folder")
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"prepare: {target} exists and is not empty; give a new folder")
    counts = {"changed": 0, "linked": 0, "copied": 0, "files": 0}
    before: list[torch.Tensor] = []  # the timing sample only
    after: list[torch.Tensor] = []
    bytes_before = bytes_after = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        out = target / path.relative_to(source)
        out.parent.mkdir(parents=True, exist_ok=True)
        counts["files"] += 1
        data = jpeg_ops.read_bytes(path) if path.suffix.lower() in (".jpg", ".jpeg") else None
        if data is not None and jpeg_ops.JPEG_OP_AVAILABLE and jpeg_ops.is_progressive(data):
            try:
                rewritten = to_baseline(data, restart_rows)
            except CorruptImageError:
                counts[_place(path, out)] += 1  # left as it is: the dataset's on_error decides at training time
                continue
            out.write_bytes(rewritten.numpy().tobytes())
            shutil.copystat(path, out)
            counts["changed"] += 1
            bytes_before += data.numel()
            bytes_after += rewritten.numel()
            if measure and len(before) < sample:
                before.append(data)
                after.append(rewritten)
        else:
            counts[_place(path, out)] += 1
    ms_before = ms_after = None
    if measure and before:
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        boxes = [crop_params(*jpeg_ops.jpeg_size(d)) for d in before]
        torch.random.set_rng_state(generator_state)
        ms_before, ms_after = _time_per_image(before, boxes, size, 3), _time_per_image(after, boxes, size, 3)
    return PrepareReport(
        files=counts["files"],
        changed=counts["changed"],
        linked=counts["linked"],
        copied=counts["copied"],
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        ms_before=ms_before,
        ms_after=ms_after,
        timed=len(before) if ms_before is not None else 0,
    )
