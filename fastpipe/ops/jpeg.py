"""Decode only a crop of a JPEG and resize it in one pass: the op behind fastpipe's real-image pipelines.

``decode_jpeg_crop`` is what a training sample costs: the C++ op ``fastpipe::decode_jpeg_crop``
(``csrc/jpeg/``, built as the optional extension ``fastpipe._jpeg`` on libjpeg-turbo) decodes
only the rows and iMCU columns the box needs, at 1/2, 1/4 or 1/8 DCT scale when the scaled
box still covers the output, and resizes with a fixed-point separable triangle filter (PIL's
BILINEAR, antialiased when shrinking) with the horizontal flip fused; its two passes run AVX2
kernels where the CPU has them and portable ones elsewhere, chosen at run time with the same
bytes out (``csrc/jpeg/resize.cpp``, ``tests/ops/test_jpeg_resize.py``). Anything the op cannot
serve falls back to PIL with the same crop semantics: non-JPEG files (detected by magic
bytes), and every file when the extension was not built (``JPEG_OP_AVAILABLE`` says which;
``which_decoder`` says which path a given file takes).

Tolerance against PIL (``Image.open(f).convert("RGB").resize((w, h), Image.BILINEAR,
box=(left, top, left + width, top + height))``), checked by ``tests/ops/test_jpeg.py`` on
photographs at several sizes, qualities and flavours:

- no DCT scaling (the box is less than twice the output in a side): mean absolute difference
  < 0.5 and max <= 3 levels (measured: mean 0.1-0.2, max 1; the op runs the passes in the
  other order and keeps 6 more bits between them than PIL's uint8 intermediate);
- DCT scaling by 1/s: equal, within that same tolerance, to PIL's own scaled decode
  (``Image.draft``) resized on the box / s, so the geometry is exact; against the full-size
  path above, mean absolute difference < 2.5 (measured 0.4-2.2 on shrinks of 2x-6x): the
  decoder's frequency-domain shrink is sharper than PIL's triangle filter, and edges can
  differ by tens of levels.

A truncated file is an error when the truncation falls inside the rows the box needs; the
decoder stops after the box's last row, so damage below it goes unnoticed. EXIF orientation
is not applied, as in PIL's ``Image.open`` and torchvision's ``decode_jpeg`` by default.

Size limit: an image whose header claims more than :func:`max_image_pixels` pixels (PIL's
``Image.MAX_IMAGE_PIXELS`` by default, about 89 million) is refused with
:class:`~fastpipe.errors.DecompressionBombError` before anything sized by it is allocated, by
:func:`jpeg_size`, :func:`decode_jpeg_crop`, :func:`jpeg_entropy_floor` and
:class:`~fastpipe.datasets.DecodeCropOnDevice`. :func:`set_max_image_pixels` is the one place
to change it (``None`` disables it). The same limit caps libjpeg's own memory (16 bytes per
pixel of the limit, through ``max_memory_to_use``) and the op's scratch buffers, and bounds
the output size. PIL only warns between one and two times its limit; fastpipe refuses at
once, since a worker would otherwise allocate gigabytes.

Cost: the decoder must still entropy-decode every row above the box and, for progressive
files, the whole image; that, not the pixels, is most of what is left (see
``benchmarks/bench_jpeg.py``, which splits baseline and progressive files).
"""

from __future__ import annotations

import io
import os
from typing import Union

import torch

from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError, ExtensionUnavailableError
from fastpipe.ops._device import require_cpu

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, torch.Tensor]

#: How errors name a source given as bytes or a tensor; callers that know the path
#: (fastpipe.datasets) put it in place of this.
UNNAMED_SOURCE = "<image bytes>"
#: Box coordinates at or above this are out of range for any image (JPEG's sides are below 2**16).
_MAX_COORDINATE = 2**31 - 1

JPEG_OP_LOAD_ERROR: BaseException | None = None
try:
    from fastpipe.ops._load import load_extension

    load_extension("_jpeg")  # loading it runs the TORCH_LIBRARY_FRAGMENT registration; by path, whatever the import order

    JPEG_OP_AVAILABLE = True
except (ImportError, OSError) as exc:
    JPEG_OP_AVAILABLE = False
    JPEG_OP_LOAD_ERROR = exc

_JPEG_MAGIC = b"\xff\xd8\xff"
# Start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but are not frames.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


_FOLLOW_PIL = object()
_max_pixels_setting: "int | None | object" = _FOLLOW_PIL


def set_max_image_pixels(limit: int | None) -> None:
    """Set the largest image, in pixels (width x height), that fastpipe decodes; ``None`` removes the limit.

    The one place to change it: :func:`jpeg_size`, :func:`decode_jpeg_crop`,
    :func:`jpeg_entropy_floor`, the datasets and :class:`~fastpipe.datasets.DecodeCropOnDevice`
    all read it on each call. Until it is called, the limit is PIL's ``Image.MAX_IMAGE_PIXELS``
    (read on each call, so code that already set PIL's limit for torchvision gets the same here).
    It is a setting of the process: DataLoader workers started with ``spawn`` or ``forkserver``
    import fastpipe afresh, so set it there too (e.g. in ``worker_init_fn``), as for PIL's.

    Raises:
        ConfigError: ``limit`` is neither a positive int nor None.
    """
    global _max_pixels_setting
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ConfigError(f"the pixel limit must be a positive int, or None for no limit; got {limit!r}")
    _max_pixels_setting = limit


def max_image_pixels() -> int | None:
    """The pixel limit now in force: :func:`set_max_image_pixels`'s value, else PIL's ``Image.MAX_IMAGE_PIXELS``."""
    if _max_pixels_setting is not _FOLLOW_PIL:
        return _max_pixels_setting  # type: ignore[return-value]
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return int(limit) if limit else None


def check_image_pixels(height: int, width: int, name: str) -> None:
    """Raise :class:`DecompressionBombError` naming ``name`` if a ``height`` x ``width`` image is over the limit."""
    limit = max_image_pixels()
    if limit is not None and height * width > limit:
        raise DecompressionBombError(
            f"{name}: the header says {height}x{width} = {height * width} pixels, over the pixel limit of {limit} "
            "(a decompression bomb?); raise or disable it with fastpipe.ops.jpeg.set_max_image_pixels"
        )


def jpeg_op_status() -> str:
    """One line for reports, benchmark rows and skip reasons: which decoder runs JPEGs, and why."""
    if JPEG_OP_AVAILABLE:
        return "fastpipe._jpeg loaded (libjpeg-turbo crop decode)"
    return f"fastpipe._jpeg not loaded ({type(JPEG_OP_LOAD_ERROR).__name__}: {JPEG_OP_LOAD_ERROR}); JPEGs decode with PIL"


def require_jpeg_op() -> None:
    """Raise a clear error if the C++ JPEG op is not loaded (the PIL fallback needs no such check)."""
    if not JPEG_OP_AVAILABLE:
        raise ExtensionUnavailableError(
            f"{jpeg_op_status()}. Rebuild it with: pip install --no-build-isolation -e . "
            "(needs a C++ compiler and libjpeg-turbo's headers, e.g. apt install libjpeg62-turbo-dev or libjpeg-turbo8-dev)"
        )


def read_bytes(source: Source) -> torch.Tensor:
    """The file's bytes as a 1-D uint8 tensor (no copy for tensors; one read for paths)."""
    if isinstance(source, torch.Tensor):
        require_cpu("jpeg", source=source)
        if source.dtype != torch.uint8 or source.dim() != 1:
            raise ConfigError(f"a tensor source must be the file's bytes, 1-D uint8; got {source.dtype} {tuple(source.shape)}")
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytearray(source) if isinstance(source, bytes) else source  # torch.frombuffer wants a writable buffer
        return torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    with open(source, "rb", buffering=0) as f:
        buf = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(buf)
    return torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)


def is_jpeg(data: torch.Tensor) -> bool:
    """True when the bytes start with JPEG's SOI marker followed by another marker."""
    return data.numel() >= 3 and data.numpy().data[:3] == _JPEG_MAGIC


def which_decoder(source: Source) -> str:
    """``"fastpipe._jpeg"`` when ``decode_jpeg_crop`` would use the C++ op for this file, else ``"PIL"``."""
    return "fastpipe._jpeg" if JPEG_OP_AVAILABLE and is_jpeg(read_bytes(source)) else "PIL"


def _name(source: Source) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else UNNAMED_SOURCE


def sof_offset(buf: "bytes | memoryview") -> int | None:
    """Offset of the first start-of-frame marker (its 0xFF), walking the marker segments; None if ``buf`` has none."""
    pos = 2
    while pos + 4 <= len(buf):
        if buf[pos] != 0xFF:
            return None
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01,) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        if marker in _SOF_MARKERS:
            return pos
        pos += 2 + ((buf[pos + 2] << 8) | buf[pos + 3])
    return None


#: Start-of-frame markers of progressive JPEGs (SOF2, SOF6, SOF10, SOF14).
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})


def is_progressive(data: torch.Tensor) -> bool:
    """True when the JPEG's first start-of-frame marker is a progressive one: several times slower to decode
    than baseline, which ``fastpipe prepare`` rewrites losslessly. Reads the markers only; needs no extension."""
    if not is_jpeg(data):
        return False
    buf = data.numpy().data
    pos = sof_offset(buf)
    return pos is not None and buf[pos + 1] in _PROGRESSIVE_SOF


def _jpeg_header_size(buf: "bytes | memoryview") -> tuple[int, int] | None:
    """(height, width) from the first start-of-frame marker, or None if there is none in ``buf``."""
    pos = sof_offset(buf)
    if pos is None or pos + 9 > len(buf):
        return None
    return (buf[pos + 5] << 8) | buf[pos + 6], (buf[pos + 7] << 8) | buf[pos + 8]


def jpeg_size(source: Source) -> tuple[int, int]:
    """The image's (height, width) from its header alone, to draw a crop box before decoding.

    JPEGs are read by walking their markers to the start-of-frame (a few microseconds, cheaper
    than PIL's lazy ``Image.open``; ``benchmarks/bench_jpeg.py`` prints both); other formats
    use PIL's lazy open. Pass the bytes (or tensor) rather than a path when the same file is
    decoded next, so it is read once.

    Raises:
        CorruptImageError: no size can be read; the message names the file.
        DecompressionBombError: the size is over :func:`max_image_pixels`.
    """
    data = read_bytes(source)
    if is_jpeg(data):
        size = _jpeg_header_size(data.numpy().data)  # a memoryview: no copy
        if size is not None and size[0] > 0 and size[1] > 0:
            check_image_pixels(size[0], size[1], _name(source))
            return size
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
            size = im.size[1], im.size[0]
    except Image.DecompressionBombError as exc:
        raise DecompressionBombError(f"{_name(source)}: {exc}") from exc
    except Exception as exc:  # PIL raises several types for unreadable files
        raise CorruptImageError(f"{_name(source)}: cannot read the image header ({exc})") from exc
    check_image_pixels(size[0], size[1], _name(source))
    return size


def _check_geometry(box: tuple[int, int, int, int], size: tuple[int, int], name: str) -> None:
    top, left, height, width = box
    if height <= 0 or width <= 0 or top < 0 or left < 0:
        raise ConfigError(f"{name}: crop box (top, left, height, width) must have top, left >= 0 and a positive size, got {box}")
    if top + height > _MAX_COORDINATE or left + width > _MAX_COORDINATE:  # Python ints: no overflow here
        raise ConfigError(
            f"{name}: crop box {box} (top, left, height, width) reaches past row or column {_MAX_COORDINATE}, outside any image"
        )
    if size[0] <= 0 or size[1] <= 0 or size[0] > 65535 or size[1] > 65535:
        raise ConfigError(f"{name}: output size (height, width) must be positive and at most 65535, got {size}")
    limit = max_image_pixels()
    if limit is not None and size[0] * size[1] > limit:
        raise ConfigError(f"{name}: output size {size} is over the pixel limit of {limit} (fastpipe.ops.jpeg.set_max_image_pixels)")


def _op_error(message: str, name: str) -> Exception:
    """The error to raise for the op's RuntimeError ``message``, naming the file (the class says whose fault it is)."""
    if "is not inside" in message or "output size" in message or "scratch memory" in message:
        return ConfigError(f"{name}: {message}")
    if "pixel limit" in message:
        return DecompressionBombError(f"{name}: {message}; raise or disable it with fastpipe.ops.jpeg.set_max_image_pixels")
    if "Backing store not supported" in message or "Insufficient memory" in message:  # over libjpeg's max_memory_to_use
        return DecompressionBombError(
            f"{name}: {message}: decoding needs more memory than the pixel limit of {max_image_pixels()} allows "
            "(fastpipe.ops.jpeg.set_max_image_pixels)"
        )
    return CorruptImageError(f"{name}: {message}")


def decode_jpeg_crop_op(
    data: torch.Tensor, top: int, left: int, height: int, width: int, out_h: int, out_w: int, hflip: bool = False
) -> torch.Tensor:
    """The raw op: JPEG bytes (1-D uint8) to the box resized to (3, out_h, out_w) uint8 RGB, CHW.

    Raises ``RuntimeError`` with libjpeg's message for a corrupt or truncated file (a
    truncation below the box's last row is not noticed: the decoder stops there). Passes
    :func:`max_image_pixels`.
    """
    require_jpeg_op()
    require_cpu("decode_jpeg_crop_op", data=data)
    return torch.ops.fastpipe.decode_jpeg_crop(
        data, int(top), int(left), int(height), int(width), int(out_h), int(out_w), bool(hflip), max_image_pixels()
    )


def jpeg_entropy_floor(source: Source, bottom: int) -> int:
    """Entropy-decode what a crop reaching full-size row ``bottom`` cannot skip; returns the rows covered.

    A measurement aid (``benchmarks/bench_jpeg.py``), not part of any pipeline: the C++ op
    ``fastpipe::_jpeg_entropy_floor`` with :func:`max_image_pixels` and errors naming the file.

    Raises:
        CorruptImageError: the file cannot be read as a JPEG (damage inside the scans decoded
            is not an error here: the floor measures time, it does not validate).
        DecompressionBombError: the header's size is over the pixel limit.
    """
    require_jpeg_op()
    data = read_bytes(source)
    try:
        return int(torch.ops.fastpipe._jpeg_entropy_floor(data, int(bottom), max_image_pixels()))
    except RuntimeError as exc:
        raise _op_error(str(exc).split("\n")[0], _name(source)) from None


def _decode_pil(data: torch.Tensor, box: tuple[int, int, int, int], size: tuple[int, int], hflip: bool, name: str) -> torch.Tensor:
    """PIL's reference semantics: convert("RGB"), resize with a float box, BILINEAR, optional flip."""
    import numpy as np
    from PIL import Image

    top, left, height, width = box
    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
            check_image_pixels(im.size[1], im.size[0], name)
            if top + height > im.size[1] or left + width > im.size[0]:
                raise ConfigError(f"{name}: crop box {box} (top, left, height, width) is not inside the {im.size[1]}x{im.size[0]} image")
            out = im.convert("RGB").resize((size[1], size[0]), Image.BILINEAR, box=(left, top, left + width, top + height))
    except (ConfigError, DecompressionBombError):
        raise
    except Image.DecompressionBombError as exc:  # PIL's own limit, which its open() applies first
        raise DecompressionBombError(f"{name}: {exc}") from exc
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError... for bad files
        raise CorruptImageError(f"{name}: cannot decode the image ({type(exc).__name__}: {exc})") from exc
    if hflip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1).contiguous()


def decode_jpeg_crop(source: Source, box: tuple[int, int, int, int], size: tuple[int, int], hflip: bool = False) -> torch.Tensor:
    """The crop ``box`` = (top, left, height, width) of the image, resized to ``size`` = (h, w), as uint8 (3, h, w) RGB.

    ``source`` is a path, the file's bytes, or a 1-D uint8 tensor of them. JPEGs go through
    the C++ op when it is built; other formats, and JPEGs without the op, through PIL with
    the same semantics (see the module docstring for the tolerance between the two). Draw
    ``box`` from :func:`jpeg_size`, e.g. with ``torchvision.transforms.RandomResizedCrop.get_params``.

    Raises:
        ConfigError: the box is not inside the image, or a size is not positive or over the limit.
        CorruptImageError: the file is corrupt, truncated or not an image; the message names it.
        DecompressionBombError: (a CorruptImageError) the header's size is over :func:`max_image_pixels`.
    """
    box = tuple(int(v) for v in box)  # type: ignore[assignment]
    size = (int(size[0]), int(size[1]))
    name = _name(source)
    _check_geometry(box, size, name)
    data = read_bytes(source)
    if JPEG_OP_AVAILABLE and is_jpeg(data):
        try:
            return torch.ops.fastpipe.decode_jpeg_crop(
                data, box[0], box[1], box[2], box[3], size[0], size[1], bool(hflip), max_image_pixels()
            )
        except RuntimeError as exc:
            raise _op_error(str(exc).split("\n")[0], name) from None
    return _decode_pil(data, box, size, bool(hflip), name)


def decode_pil(source: Source, box: tuple[int, int, int, int], size: tuple[int, int], hflip: bool = False) -> torch.Tensor:
    """:func:`decode_jpeg_crop` through PIL alone, whatever the format: what torchvision's recipe would decode.

    PIL decodes through libjpeg warnings (damaged entropy data comes out as grey or smeared
    blocks) where the op raises; a truncated file is still an error. Same errors as
    :func:`decode_jpeg_crop`.
    """
    box = tuple(int(v) for v in box)  # type: ignore[assignment]
    size = (int(size[0]), int(size[1]))
    name = _name(source)
    _check_geometry(box, size, name)
    return _decode_pil(read_bytes(source), box, size, bool(hflip), name)


if JPEG_OP_AVAILABLE:

    @torch.library.register_fake("fastpipe::decode_jpeg_crop")
    def _decode_jpeg_crop_fake(
        data: torch.Tensor, top: int, left: int, height: int, width: int, out_h: int, out_w: int, hflip: bool, max_pixels: int | None = None
    ) -> torch.Tensor:
        torch._check(data.dim() == 1 and data.dtype == torch.uint8, lambda: "decode_jpeg_crop: data must be 1-D uint8 bytes")
        return data.new_empty((3, out_h, out_w))
