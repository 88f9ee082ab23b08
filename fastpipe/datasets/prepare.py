"""``prepare_folder``: a copy of an image folder with its progressive JPEGs rewritten as baseline, losslessly.

Why: a progressive JPEG must have every scan entropy-decoded, over the whole image, before any
pixel of a crop exists, so decode-and-crop cannot skip or stop early on it: such files cost
several times a baseline file (``benchmarks/bench_jpeg.py`` splits them). Rewriting one as
baseline from its own quantised DCT coefficients (``fastpipe::_jpeg_to_baseline``, libjpeg's
transcoding path, as ``jpegtran``) changes only the entropy coding: the decoded pixels are the
same bit for bit (``tests/datasets/test_prepare.py`` checks it), and the labels and folder layout are kept.
Every other file's content is hard-linked (copied where links cannot be made); symlinks are followed, never
copied as links (a relative one would dangle at another depth). Optional to use: the training code is
unchanged, only ``root`` points at the prepared folder.

Nothing the user trains on is left half-made: the copy is written beside the target and renamed to it only
when complete and when ``ImageFolder`` lists the same classes and files in it as in the source
(:mod:`fastpipe.datasets._prepare_tree` says why each check is there); an interrupted run is resumed by the
same call.

Restart markers (``restart_rows``) are offered for measurement only: they would let a decoder
resynchronise mid-scan, but libjpeg-turbo turns off its fast Huffman path when they are present,
so they are off by default; keep them only where ``benchmarks/bench_jpeg.py`` shows a gain.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from fastpipe.datasets._prepare_tree import TMP_SUFFIX, check_places, check_same_listing, make_folder, partial_folder, walk_source
from fastpipe.datasets.crop import crop_params
from fastpipe.errors import ConfigError, CorruptImageError
from fastpipe.ops import jpeg as jpeg_ops

#: libjpeg's largest restart interval (a 16-bit field in the DRI marker); the op refuses more.
MAX_RESTART_ROWS = 65535


def to_baseline(data: torch.Tensor, restart_rows: int = 0) -> torch.Tensor:
    """The JPEG in ``data`` rewritten as baseline from its DCT coefficients (pixels identical); its bytes.

    Raises DecompressionBombError (a CorruptImageError) for a header over :func:`fastpipe.ops.jpeg.max_image_pixels`,
    checked before libjpeg allocates anything, as the decode ops check it.
    """
    if isinstance(restart_rows, bool) or not isinstance(restart_rows, int) or not 0 <= restart_rows <= MAX_RESTART_ROWS:
        raise ConfigError(f"restart_rows must be a whole number of MCU rows in [0, {MAX_RESTART_ROWS}] (0: none). Got {restart_rows!r}.")
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
    failed: list[str] = field(default_factory=list)  # progressive files that could not be rewritten (kept as they are)
    resumed: int = 0  # files an interrupted run had already put in place, kept

    def summary(self) -> str:
        line = (
            f"{self.changed} of {self.files} files rewritten (progressive -> baseline, pixels identical), "
            f"{self.linked} linked, {self.copied} copied"
        )
        if self.resumed:
            line += f", {self.resumed} kept from the interrupted run"
        if self.failed:
            line += f", {len(self.failed)} failed to rewrite (kept as they are)"
        line += f"; rewritten files {self.bytes_before / 1e6:.1f} MB -> {self.bytes_after / 1e6:.1f} MB"
        if self.ms_before is not None and self.ms_after is not None:
            line += (
                f"; decode-and-crop on {self.timed} of them {self.ms_before:.3f} -> {self.ms_after:.3f} ms per image "
                f"({self.ms_before / self.ms_after:.2f}x faster)"
            )
        return line


#: Rewritten files kept in memory to time before and after (enough for a stable per-image figure).
SAMPLE = 64
#: What an interrupted run leaves in its partial folder, so a rerun knows it resumes the same work.
MARKER = ".fastpipe-prepare.json"


def _put(out: Path, write: Callable[[Path], None]) -> None:
    """Write ``out`` through a temporary name and rename it: a file under its own name is always complete."""
    tmp = out.with_name(out.name + TMP_SUFFIX)
    tmp.unlink(missing_ok=True)
    write(tmp)
    os.replace(tmp, out)


def _place(real: Path, out: Path) -> str:
    """Hard-link the file's content (``real``: the source's path with every symlink resolved), or copy it."""

    def link(tmp: Path) -> None:
        os.link(real, tmp, follow_symlinks=True)

    try:
        _put(out, link)
        return "linked"
    except OSError:
        _put(out, lambda tmp: shutil.copy2(real, tmp))
        return "copied"


def _done_before(out: Path, real: Path) -> bool:
    """Whether a resumed run already put this file in place: its name exists, with the source's mtime
    (links share the inode, copies and rewrites carry it through ``copystat``)."""
    try:
        return out.stat(follow_symlinks=False).st_mtime_ns == real.stat().st_mtime_ns and not out.is_symlink()
    except OSError:
        return False


def _time_per_image(datas: list[torch.Tensor], boxes: list[tuple[int, int, int, int]], size: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for data, box in zip(datas, boxes):
            jpeg_ops.decode_jpeg_crop(data, box, (size, size))
        best = min(best, time.thread_time() - start)
    return best * 1e3 / max(len(datas), 1)


def check_options(restart_rows: int, size: int, sample: int) -> None:
    """Bad options are errors before any file is read (a bad ``restart_rows`` is not a damaged file)."""
    if isinstance(restart_rows, bool) or not isinstance(restart_rows, int) or not 0 <= restart_rows <= MAX_RESTART_ROWS:
        raise ConfigError(f"restart_rows must be a whole number of MCU rows in [0, {MAX_RESTART_ROWS}] (0: none). Got {restart_rows!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"size must be a positive number of pixels. Got {size!r}.")
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ConfigError(f"sample must be a number of files >= 0. Got {sample!r}.")


def _start(source: Path, target: Path, restart_rows: int) -> Path:
    """The partial folder to write into, new or left by an interrupted run of the same preparation."""
    partial = partial_folder(target)
    marker = {"source": os.path.realpath(source), "restart_rows": restart_rows}
    if partial.exists():
        try:
            left = json.loads((partial / MARKER).read_text())
        except (OSError, ValueError):
            left = None
        if left != marker:
            raise ConfigError(
                f"prepare: {partial} is left by an interrupted run of another preparation (or is not fastpipe's); "
                f"delete it (rm -r {shlex.quote(str(partial))}) and rerun"
            )
        return partial
    make_folder(partial, target)
    (partial / MARKER).write_text(json.dumps(marker))
    return partial


def prepare_folder(
    source: "str | os.PathLike[str]",
    target: "str | os.PathLike[str]",
    *,
    restart_rows: int = 0,
    measure: bool = True,
    size: int = 224,
    sample: int = SAMPLE,
    progress: Callable[[int, int], None] | None = None,
) -> PrepareReport:
    """Copy ``source`` to ``target`` (a new folder), progressive JPEGs rewritten as baseline, the rest hard-linked.

    The copy is made in a hidden folder beside ``target`` (``.NAME.fastpipe-partial``) and renamed to ``target``
    only once every file is in place and ``torchvision.datasets.ImageFolder`` lists the same classes and files in
    it as in ``source``: an interrupted run leaves no ``target`` to train on by mistake, and the same call again
    resumes it (files already in place are kept). Symlinked files and folders are followed, and the file's content
    is linked or copied, never the link. Progressive files that cannot be rewritten (damaged) are kept as they are
    and named in ``PrepareReport.failed``.

    ``measure``: time decode-and-crop (``size``, the same seeded RandomResizedCrop boxes before and after, best
    of 3 rounds of thread CPU time) on the first ``sample`` rewritten files, for the report: only those are kept in
    memory, so a folder of any size is prepared in bounded memory. ``progress(done, total)`` is called after each
    file (a progress bar; an exception it raises stops the run as Ctrl-C does, resumable).

    Raises:
        ConfigError: bad options, or a target that must not or cannot be written (inside the source, a file...),
            or a copy whose listing differs from the source's (it is left in the partial folder).
    """
    check_options(restart_rows, size, sample)
    source, target = Path(source), Path(target)
    if not source.is_dir():
        raise ConfigError(f"prepare: {source} is not a folder")
    tree = walk_source(source)
    check_places(source, target, tree)
    if tree.broken_links:
        raise ConfigError(
            f"prepare: {len(tree.broken_links)} broken symlink(s) in {source} (e.g. {tree.broken_links[0]}), which ImageFolder "
            "lists but cannot load; fix or remove them"
        )
    partial = _start(source, target, restart_rows)
    counts = {"changed": 0, "linked": 0, "copied": 0, "resumed": 0}
    failed: list[str] = []
    before: list[torch.Tensor] = []  # the timing sample only
    after: list[torch.Tensor] = []
    bytes_before = bytes_after = 0
    for done, relative in enumerate(tree.files, 1):
        real = Path(os.path.realpath(source / relative))
        out = partial / relative
        make_folder(out.parent, target)
        if _done_before(out, real):
            counts["resumed"] += 1
        else:
            data = jpeg_ops.read_bytes(real) if relative.suffix.lower() in (".jpg", ".jpeg") else None
            rewritten = None
            if data is not None and jpeg_ops.JPEG_OP_AVAILABLE and jpeg_ops.is_progressive(data):
                try:
                    rewritten = to_baseline(data, restart_rows)
                except CorruptImageError as exc:
                    failed.append(f"{relative}: {exc}")  # kept as it is: the dataset's on_error decides at training time
            if rewritten is None:
                counts[_place(real, out)] += 1
            else:
                content = rewritten.numpy().tobytes()

                def write(tmp: Path, content: bytes = content) -> None:
                    tmp.write_bytes(content)
                    shutil.copystat(real, tmp)

                _put(out, write)
                counts["changed"] += 1
                bytes_before += data.numel()
                bytes_after += rewritten.numel()
                if measure and len(before) < sample:
                    before.append(data)
                    after.append(rewritten)
        if progress is not None:
            progress(done, len(tree.files))
    check_same_listing(source, partial, target)
    (partial / MARKER).unlink()
    if target.is_dir():
        target.rmdir()  # empty (checked): the user's folder is replaced by the complete copy
    os.rename(partial, target)
    ms_before = ms_after = None
    if measure and before:
        generator_state = torch.random.get_rng_state()
        torch.random.default_generator.manual_seed(0)  # the CPU generator only: the user's CUDA ones are not touched
        boxes = [crop_params(*jpeg_ops.jpeg_size(d)) for d in before]
        torch.random.set_rng_state(generator_state)
        ms_before, ms_after = _time_per_image(before, boxes, size, 3), _time_per_image(after, boxes, size, 3)
    return PrepareReport(
        files=len(tree.files),
        changed=counts["changed"],
        linked=counts["linked"],
        copied=counts["copied"],
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        ms_before=ms_before,
        ms_after=ms_after,
        timed=len(before) if ms_before is not None else 0,
        failed=failed,
        resumed=counts["resumed"],
    )
