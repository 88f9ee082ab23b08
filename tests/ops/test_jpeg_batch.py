"""fastpipe::decode_jpeg_crop_batch(_out): the same pixels as the single op, threads or not, errors by index and name, opcheck."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.library import opcheck

import fastpipe.ops.jpeg as jpeg
from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError
from fastpipe.ops.jpeg_batch import decode_jpeg_crop_batch

requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


def _encode(array: np.ndarray, fmt: str = "JPEG", **options: object) -> torch.Tensor:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **options)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


@pytest.fixture(scope="module")
def files() -> list[torch.Tensor]:
    """Ten small photos-like files: baseline, progressive, 4:4:4, greyscale; sizes differ."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:240, 0:320]
    base = np.stack([x * 0.7, y, 128 + 90 * np.sin(x / 17.0) * np.cos(y / 11.0)], axis=-1)
    out = []
    for k in range(10):
        array = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)[: 200 + 4 * k, : 300 - 6 * k]
        if k == 3:
            out.append(_encode(array[..., 0], quality=88))
        else:
            out.append(_encode(array, quality=80 + k, progressive=k % 3 == 0, subsampling=0 if k == 5 else 2))
    return out


def _boxes(n: int) -> torch.Tensor:
    return torch.tensor([[3 + k, 5 + 2 * k, 150 - 3 * k, 190 - 5 * k] for k in range(n)], dtype=torch.int64)


@requires_op
@pytest.mark.parametrize("threads", [1, 3])
def test_batch_equals_the_single_op(files: list[torch.Tensor], threads: int) -> None:
    boxes, flips = _boxes(len(files)), torch.tensor([k % 2 == 1 for k in range(len(files))])
    result = decode_jpeg_crop_batch(files, boxes, (48, 40), flips, threads=threads)
    assert result.images.shape == (len(files), 3, 48, 40) and result.images.dtype == torch.uint8
    for k, data in enumerate(files):
        single = jpeg.decode_jpeg_crop(data, tuple(boxes[k].tolist()), (48, 40), hflip=bool(flips[k]))
        assert torch.equal(result.images[k], single), k
    assert result.failed == [] and result.pil == []


@requires_op
def test_writes_into_the_callers_tensor_and_nothing_else(files: list[torch.Tensor]) -> None:
    """`out` is written in place (a view of a bigger buffer, as the thread loader's ring gives); its neighbours are not touched."""
    buffer = torch.full((4 * 3 * 16 * 16 + 64,), 7, dtype=torch.uint8)
    out = buffer[: 4 * 3 * 16 * 16].view(4, 3, 16, 16)
    result = decode_jpeg_crop_batch(files[:4], _boxes(4), (16, 16), out=out, threads=2)
    assert result.images.data_ptr() == out.data_ptr()
    assert (buffer[-64:] == 7).all()
    assert torch.equal(out[2], jpeg.decode_jpeg_crop(files[2], tuple(_boxes(4)[2].tolist()), (16, 16)))


@requires_op
def test_opcheck(files: list[torch.Tensor]) -> None:
    """Schemas, fake kernels and dispatch as torch.library.opcheck sees them, for the functional and the out op."""
    boxes, flips = _boxes(3), torch.tensor([False, True, False])
    opcheck(torch.ops.fastpipe.decode_jpeg_crop_batch.default, (files[:3], boxes, flips, 32, 24, 2, None))
    out = torch.zeros((3, 3, 32, 24), dtype=torch.uint8)
    opcheck(torch.ops.fastpipe.decode_jpeg_crop_batch_out.default, (files[:3], boxes, flips, out, 2, None))


def test_errors_name_index_and_file_and_follow_on_error(files: list[torch.Tensor]) -> None:
    """A truncated file: raise names it with its batch index; skip reports it and decodes the rest; a PNG goes through PIL."""
    truncated = files[1][: files[1].numel() // 3].clone()
    png = _encode(np.zeros((200, 300, 3), dtype=np.uint8) + 90, "PNG")
    data, names = [files[0], truncated, png], ["a.jpg", "b.jpg", "c.png"]
    with pytest.raises(CorruptImageError, match=r"b\.jpg \(batch index 1\)"):
        decode_jpeg_crop_batch(data, _boxes(3), (16, 16), names=names)
    result = decode_jpeg_crop_batch(data, _boxes(3), (16, 16), names=names, on_error="skip", threads=2)
    assert [(f.index, f.name) for f in result.failed] == [(1, "b.jpg")] and "b.jpg" in str(result.failed[0].error)
    assert result.pil == [2] and (result.images[2] == 90).all()
    with pytest.raises(ConfigError, match="not inside"):  # the caller's bug, whatever on_error
        decode_jpeg_crop_batch([files[0]], [[0, 0, 999, 999]], (16, 16), on_error="skip")


def test_pixel_limit_raises_under_pil(files: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpeg, "_max_pixels_setting", 1000)
    with pytest.raises(DecompressionBombError, match="pixel limit"):
        decode_jpeg_crop_batch(files[:2], _boxes(2), (16, 16), on_error="pil")


def test_bad_arguments_say_what_to_change(files: list[torch.Tensor]) -> None:
    with pytest.raises(ConfigError, match=r"boxes must have shape \(2, 4\)"):
        decode_jpeg_crop_batch(files[:2], _boxes(1), (16, 16))
    with pytest.raises(ConfigError, match=r"got \(4, 2\)"):  # transposed: reshape(-1, 4) took it
        decode_jpeg_crop_batch(files[:2], _boxes(2).T.contiguous(), (16, 16))
    with pytest.raises(ConfigError, match=r"got \(8,\)"):  # flat
        decode_jpeg_crop_batch(files[:2], _boxes(2).flatten(), (16, 16))
    with pytest.raises(ConfigError, match="threads"):
        decode_jpeg_crop_batch(files[:2], _boxes(2), (16, 16), threads=0)
    with pytest.raises(ConfigError, match="contiguous uint8"):
        decode_jpeg_crop_batch(files[:2], _boxes(2), (16, 16), out=torch.empty((2, 3, 16, 15), dtype=torch.uint8))
    with pytest.raises(ConfigError, match="on_error"):
        decode_jpeg_crop_batch(files[:2], _boxes(2), (16, 16), on_error="ignore")


def test_cpu_fallback_without_the_extension(files: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fastpipe._jpeg every file goes through PIL, one by one, into the same tensor."""
    monkeypatch.setattr(jpeg, "JPEG_OP_AVAILABLE", False)
    result = decode_jpeg_crop_batch(files[:2], _boxes(2), (16, 16))
    assert result.pil == [0, 1]
    assert torch.equal(result.images[1], jpeg.decode_pil(files[1], tuple(_boxes(2)[1].tolist()), (16, 16)))


def test_a_failed_non_jpeg_is_reported_once_and_a_fresh_output_is_zeroed(files: list[torch.Tensor]) -> None:
    """Under "skip" a damaged PNG is in ``failed`` only (not also in ``pil``), and the slot of a failed file in the
    tensor the op made is zeros, not left-over memory."""
    png = _encode(np.zeros((200, 300, 3), dtype=np.uint8) + 90, "PNG")
    damaged = png[: png.numel() // 2].clone()
    truncated = files[1][: files[1].numel() // 3].clone()
    data = [files[0], damaged, truncated, png]
    for _ in range(3):  # left-over memory of the same size, full of 255s, for the allocator to hand back
        garbage = torch.full((4, 3, 16, 16), 255, dtype=torch.uint8)
        del garbage
        result = decode_jpeg_crop_batch(data, _boxes(4), (16, 16), on_error="skip")
        assert sorted(f.index for f in result.failed) == [1, 2]
        assert result.pil == [3]
        assert (result.images[1] == 0).all() and (result.images[2] == 0).all()


_NO_THREADS = """
import io, resource
import numpy as np, torch
from PIL import Image
from fastpipe.ops.jpeg_batch import decode_jpeg_crop_batch
buf = io.BytesIO()
Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(buf, "JPEG")
data = [torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8) for _ in range(8)]
boxes = [[0, 0, 64, 64]] * 8
decode_jpeg_crop_batch(data, boxes, (16, 16), threads=1)
for margin in (12, 2):  # room for one more thread stack (8 MiB), then for none
    out = torch.zeros((8, 3, 16, 16), dtype=torch.uint8)
    vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (margin << 20), resource.RLIM_INFINITY))
    result = decode_jpeg_crop_batch(data, boxes, (16, 16), out=out, threads=8)
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("ok", margin, bool((out == 90).all()), len(result.failed))
"""


@requires_op
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc (Linux)")
def test_threads_that_cannot_start_leave_the_work_to_those_that_did() -> None:
    """Under an address-space limit with room for one extra thread stack, the second std::thread cannot start: before
    the fix the first, still joinable, made the unwinding call std::terminate (the process aborted); with no room at
    all the call failed. Now the started threads (the caller included) decode every image."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _NO_THREADS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.split("\n")[:2] == ["ok 12 True 0", "ok 2 True 0"], done.stdout
