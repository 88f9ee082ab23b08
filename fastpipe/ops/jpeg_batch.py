"""Decode a whole batch of JPEG crops at once, by native threads, into one uint8 (N, 3, H, W) tensor.

Why: a DataLoader worker pays, around each 0.7 ms decode, for per-sample Python, collate and the
copy between processes. The C++ op ``fastpipe::decode_jpeg_crop_batch`` (``csrc/jpeg/decode_batch.cpp``)
decodes every file of a batch with a pool of native threads, the GIL released, straight into the
batch's own memory: a new tensor, or ``out`` given by the caller (a recycled or pinned buffer).

Per-file errors do not stop the batch: the op marks the file, and this wrapper decodes that file
again alone (:func:`fastpipe.ops.jpeg.decode_jpeg_crop`: the message, naming the file by its
index and name, and the error class: corrupt, pixel limit, bad box), then applies ``on_error``
as :class:`fastpipe.datasets.ImageFolder` does: ``"raise"``, ``"pil"`` (decode it through PIL on
the same box and flip, as torchvision would) or ``"skip"`` (leave its planes unwritten and
report it in :attr:`BatchDecode.failed`: the caller replaces it). Non-JPEG files (PNG...) and
every file when the extension is not built go through PIL with the same crop semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.ops._device import require_cpu

ON_ERROR = ("raise", "pil", "skip")
#: The most threads one call may use (the C++ op's own bound).
MAX_THREADS = 256


@dataclass
class BatchFailure:
    """One file of a batch that could not be decoded: where it is in the batch, its name, and why."""

    index: int
    name: str
    error: CorruptImageError


@dataclass
class BatchDecode:
    """What :func:`decode_jpeg_crop_batch` returns: the images and, under ``on_error="skip"``, the files left out."""

    images: torch.Tensor
    failed: list[BatchFailure] = field(default_factory=list)
    pil: list[int] = field(default_factory=list)
    """Indices decoded through PIL: non-JPEG files, or files the op refused under ``on_error="pil"``."""


def _as_boxes(boxes: "Sequence[Sequence[int]] | torch.Tensor", n: int) -> torch.Tensor:
    tensor = torch.as_tensor(boxes, dtype=torch.int64) if n else torch.empty((0, 4), dtype=torch.int64)
    if tuple(tensor.shape) != (n, 4):  # no reshape: a flat or transposed array must not pass as boxes
        raise ConfigError(
            f"decode_jpeg_crop_batch: boxes must have shape ({n}, 4), one (top, left, height, width) per file; got {tuple(tensor.shape)}"
        )
    return tensor.contiguous()


def _as_flips(hflip: "Sequence[bool] | torch.Tensor | None", n: int) -> torch.Tensor:
    tensor = torch.zeros(n, dtype=torch.bool) if hflip is None else torch.as_tensor(hflip, dtype=torch.bool).reshape(-1)
    if tensor.shape[0] != n:
        raise ConfigError(f"decode_jpeg_crop_batch: {n} files but {tensor.shape[0]} flips")
    return tensor.contiguous()


def _check_out(out: torch.Tensor, n: int, size: tuple[int, int]) -> None:
    want = (n, 3, size[0], size[1])
    if out.dtype != torch.uint8 or tuple(out.shape) != want or not out.is_contiguous() or out.device.type != "cpu":
        raise ConfigError(
            f"decode_jpeg_crop_batch: out must be a contiguous uint8 CPU tensor of shape {want}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}{'' if out.is_contiguous() else ' (not contiguous)'}"
        )


def decode_jpeg_crop_batch(
    data: Sequence[torch.Tensor],
    boxes: "Sequence[Sequence[int]] | torch.Tensor",
    size: tuple[int, int],
    hflip: "Sequence[bool] | torch.Tensor | None" = None,
    *,
    out: torch.Tensor | None = None,
    threads: int = 1,
    on_error: str = "raise",
    names: Sequence[str] | None = None,
) -> BatchDecode:
    """Decode ``boxes[i]`` of ``data[i]`` (each a 1-D uint8 tensor of a file's bytes), resized to ``size``, flipped per ``hflip``.

    Args:
        data: the files' bytes (:func:`fastpipe.ops.jpeg.read_bytes`).
        boxes: (top, left, height, width) per file, in full-size pixels, inside the image.
        size: the output (height, width), the same for every file.
        hflip: a flip per file (default: none).
        out: where to write, a contiguous uint8 (N, 3, H, W) CPU tensor (pinned or shared memory is fine);
            a new tensor when None.
        threads: native threads decoding at once (the calling thread is one of them).
        on_error: ``"raise"``, ``"pil"`` or ``"skip"`` (see the module docstring).
        names: the files' names for error messages (default ``"<image bytes> #i"``).

    Raises:
        ConfigError: bad arguments, or a box not inside its image (whatever ``on_error``: the caller's bug).
        CorruptImageError: under ``"raise"``, the first file that failed; under ``"pil"``, one PIL cannot decode
            either; over the pixel limit (:class:`DecompressionBombError`) under every choice but ``"skip"``.
    """
    n = len(data)
    size = (int(size[0]), int(size[1]))
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got {on_error!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"threads must be an int in [1, {MAX_THREADS}], got {threads!r}")
    if names is not None and len(names) != n:
        raise ConfigError(f"decode_jpeg_crop_batch: {n} files but {len(names)} names")
    require_cpu("decode_jpeg_crop_batch", **{f"data[{i}]": d for i, d in enumerate(data)}, boxes=boxes, hflip=hflip)  # type: ignore[arg-type]
    box_tensor, flips = _as_boxes(boxes, n), _as_flips(hflip, n)
    fresh = out is None
    if out is None:
        out = torch.empty((n, 3, size[0], size[1]), dtype=torch.uint8)
    _check_out(out, n, size)
    label = list(names) if names is not None else [f"{jpeg_ops.UNNAMED_SOURCE} #{i}" for i in range(n)]
    if jpeg_ops.JPEG_OP_AVAILABLE and n:
        status = torch.ops.fastpipe.decode_jpeg_crop_batch_out(list(data), box_tensor, flips, out, threads, jpeg_ops.max_image_pixels())
        retry = status.nonzero().flatten().tolist()
    else:
        retry = list(range(n))
    result = BatchDecode(out)
    for i in retry:
        _decode_one(result, i, data[i], tuple(box_tensor[i].tolist()), size, bool(flips[i]), on_error, label[i])
    if fresh:  # our own tensor: a failed slot is zeros, not whatever the allocation held
        for failure in result.failed:
            out[failure.index].zero_()
    return result


def _decode_one(
    result: BatchDecode, i: int, data: torch.Tensor, box: tuple, size: tuple[int, int], flip: bool, on_error: str, name: str
) -> None:
    """File ``i`` again, alone: through PIL if it is not a JPEG, else through the single op for its error."""
    where = f"{name} (batch index {i})"
    try:
        result.images[i] = jpeg_ops.decode_jpeg_crop(data, box, size, hflip=flip)
        if not (jpeg_ops.JPEG_OP_AVAILABLE and jpeg_ops.is_jpeg(data)):
            result.pil.append(i)  # only once decoded: a failed file is in `failed`, not here too
        return
    except ConfigError as exc:
        raise ConfigError(_renamed(exc, where)) from exc
    except CorruptImageError as exc:
        error = type(exc)(_renamed(exc, where))
    if on_error == "skip":
        result.failed.append(BatchFailure(i, name, error))
        return
    if on_error == "raise" or isinstance(error, DecompressionBombError):
        raise error
    try:
        result.images[i] = jpeg_ops.decode_pil(data, box, size, hflip=flip)
        result.pil.append(i)
    except CorruptImageError as exc:
        raise type(exc)(_renamed(exc, where)) from exc


def _renamed(exc: Exception, where: str) -> str:
    message = str(exc)
    return message.replace(jpeg_ops.UNNAMED_SOURCE, where, 1) if jpeg_ops.UNNAMED_SOURCE in message else f"{where}: {message}"


if jpeg_ops.JPEG_OP_AVAILABLE:

    @torch.library.register_fake("fastpipe::decode_jpeg_crop_batch")
    def _batch_fake(
        data: list[torch.Tensor],
        boxes: torch.Tensor,
        hflip: torch.Tensor,
        out_h: int,
        out_w: int,
        threads: int = 1,
        max_pixels: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        torch._check(boxes.dim() == 2 and boxes.shape[0] == len(data), lambda: "decode_jpeg_crop_batch: boxes must be (N, 4)")
        return boxes.new_empty((len(data), 3, out_h, out_w), dtype=torch.uint8), boxes.new_empty((len(data),), dtype=torch.int32)

    @torch.library.register_fake("fastpipe::decode_jpeg_crop_batch_out")
    def _batch_out_fake(
        data: list[torch.Tensor],
        boxes: torch.Tensor,
        hflip: torch.Tensor,
        out: torch.Tensor,
        threads: int = 1,
        max_pixels: int | None = None,
    ) -> torch.Tensor:
        torch._check(out.dim() == 4 and out.shape[0] == len(data), lambda: "decode_jpeg_crop_batch_out: out must be (N, 3, H, W)")
        return boxes.new_empty((len(data),), dtype=torch.int32)
