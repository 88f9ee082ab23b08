"""The decode-and-crop op's resize kernels (csrc/jpeg/resize.cpp): the AVX2 kernel chosen at run time gives the
same bytes as the portable one on real photos, every JPEG flavour, flips, tails and shrink factors; the choice
op refuses what it does not know; "skip" (a timing aid) really skips the passes."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from PIL import Image

import fastpipe.ops.jpeg as jpeg

pytestmark = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


def _photos() -> list[Image.Image]:
    """Real photographs (scikit-image's samples) when installed, else a textured gradient with noise."""
    try:
        from skimage import data

        return [Image.fromarray(data.astronaut()), Image.fromarray(data.coffee()), Image.fromarray(data.chelsea())]
    except ImportError:
        y, x = np.mgrid[0:512, 0:512]
        rng = np.random.default_rng(0)
        base = np.stack([x / 2, y / 2, 128 + 80 * np.sin(x / 19.0) * np.cos(y / 13.0)], axis=-1)
        return [Image.fromarray(np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8))]


def _encode(image: Image.Image, **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    out = {}
    for i, photo in enumerate(_photos()):
        out[f"photo{i} 500x375 q90 4:2:0"] = _encode(photo.resize((500, 375)), quality=90)
        out[f"photo{i} 1600x1200 q85"] = _encode(photo.resize((1600, 1200)), quality=85)  # DCT-scaled boxes, big shrinks
    photo = _photos()[0]
    out["375x500 progressive"] = _encode(photo.resize((375, 500)), quality=75, progressive=True)
    out["333x500 4:4:4"] = _encode(photo.resize((333, 500)), quality=95, subsampling=0)
    out["greyscale"] = _encode(photo.resize((500, 375)).convert("L"), quality=88)
    out["CMYK"] = _encode(photo.resize((500, 375)).convert("CMYK"), quality=90)
    return out


def _kernels() -> list[str]:
    return list(torch.ops.fastpipe._jpeg_resize_kernels())


@pytest.fixture
def restore_kernel() -> Iterator[None]:
    before = torch.ops.fastpipe._jpeg_set_resize_kernel("auto")
    try:
        yield
    finally:
        torch.ops.fastpipe._jpeg_set_resize_kernel(before)


def _decode(kernel: str, data: bytes, box: tuple[int, int, int, int], size: tuple[int, int], hflip: bool) -> torch.Tensor:
    torch.ops.fastpipe._jpeg_set_resize_kernel(kernel)
    return jpeg.decode_jpeg_crop(data, box, size, hflip)


def _cases(height: int, width: int, rng: random.Random) -> list[tuple[tuple[int, int, int, int], tuple[int, int]]]:
    """The whole image to tiny and odd sizes (tails of 1-15 pixels, shrinks past 16 weight pairs), enlargements,
    and random RandomResizedCrop-like boxes to 224 and to random sizes."""
    cases = [
        ((0, 0, height, width), (224, 224)),
        ((0, 0, height, width), (7, 9)),  # a shrink of ~20x at the 1/8 DCT scale: > 16 weight pairs
        ((0, 0, height, width), (1, 1)),
        ((3, 5, 41, 37), (224, 223)),  # enlarged: 3 taps
        ((height - 97, width - 101, 97, 101), (33, 17)),  # the bottom-right corner
    ]
    for _ in range(6):
        h, w = rng.randint(8, height), rng.randint(8, width)
        box = (rng.randint(0, height - h), rng.randint(0, width - w), h, w)
        cases.append((box, (224, 224) if rng.random() < 0.5 else (rng.randint(1, 300), rng.randint(1, 300))))
    return cases


def test_the_portable_kernel_is_always_there() -> None:
    kernels = _kernels()
    assert kernels[-1] == "portable"
    assert set(kernels) <= {"avx2", "portable"}


def test_the_dispatched_kernel_gives_the_portable_bytes(files: dict[str, bytes], restore_kernel: None) -> None:
    if "avx2" not in _kernels():
        pytest.skip("no AVX2 kernel on this build or CPU: only the portable one runs")
    rng = random.Random(0)
    compared = 0
    for name, data in files.items():
        height, width = jpeg.jpeg_size(data)
        for box, size in _cases(height, width, rng):
            for hflip in (False, True):
                portable = _decode("portable", data, box, size, hflip)
                for kernel in ("avx2", "auto"):
                    assert torch.equal(_decode(kernel, data, box, size, hflip), portable), (name, box, size, hflip, kernel)
                compared += 1
    assert compared == len(files) * 11 * 2


def test_reused_scratch_keeps_no_state_between_images(files: dict[str, bytes], restore_kernel: None) -> None:
    """The op keeps its coefficients, weights and rows in the thread's scratch between calls: decoding the same
    cases in the opposite order (large shrinks after small ones, enlargements after shrinks) gives the same bytes,
    and so does each case decoded alone in a new thread (its scratch fresh)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(1)
    cases = [(data, box, size, i % 2 == 1) for data in files.values() for i, (box, size) in enumerate(_cases(*jpeg.jpeg_size(data), rng))]
    for kernel in _kernels():
        forward = [_decode(kernel, *case) for case in cases]
        backward = [_decode(kernel, *case) for case in reversed(cases)][::-1]
        for case, a, b in zip(cases, forward, backward):
            assert torch.equal(a, b), (kernel, case[1:])
        for case, a in zip(cases, forward):
            with ThreadPoolExecutor(max_workers=1) as fresh:  # a new thread per case: its thread_local scratch is new
                alone = fresh.submit(_decode, kernel, *case).result()
            assert torch.equal(a, alone), (kernel, case[1:])


def test_the_batch_op_uses_the_same_kernels(files: dict[str, bytes], restore_kernel: None) -> None:
    data = [torch.frombuffer(bytearray(files[k]), dtype=torch.uint8) for k in files]
    sizes = [jpeg.jpeg_size(d) for d in data]
    boxes = torch.tensor([[h // 7, w // 5, h // 2, w // 2] for h, w in sizes], dtype=torch.int64)
    flips = torch.tensor([i % 2 == 0 for i in range(len(data))])
    out = {}
    for kernel in _kernels():
        torch.ops.fastpipe._jpeg_set_resize_kernel(kernel)
        out[kernel], status = torch.ops.fastpipe.decode_jpeg_crop_batch(data, boxes, flips, 96, 80, 2)
        assert status.eq(0).all()
    for kernel, batch in out.items():
        assert torch.equal(batch, out["portable"]), kernel
    single = jpeg.decode_jpeg_crop(files["CMYK"], tuple(boxes[-1].tolist()), (96, 80), bool(flips[-1]))
    assert torch.equal(out["portable"][-1], single)


def test_skip_leaves_the_output_unwritten(files: dict[str, bytes], restore_kernel: None) -> None:
    """What a benchmark times with "skip" is the decode without the resize: the caller's buffer keeps its bytes."""
    data = [
        torch.frombuffer(bytearray(files["greyscale"]), dtype=torch.uint8),
        torch.frombuffer(bytearray(files["CMYK"]), dtype=torch.uint8),
    ]
    boxes = torch.tensor([[0, 0, 375, 500]] * 2, dtype=torch.int64)
    flips = torch.tensor([False, True])
    out = torch.full((2, 3, 64, 64), 77, dtype=torch.uint8)
    torch.ops.fastpipe._jpeg_set_resize_kernel("skip")
    status = torch.ops.fastpipe.decode_jpeg_crop_batch_out(data, boxes, flips, out, 1)
    assert status.eq(0).all()
    assert out.eq(77).all()
    torch.ops.fastpipe._jpeg_set_resize_kernel("auto")
    torch.ops.fastpipe.decode_jpeg_crop_batch_out(data, boxes, flips, out, 1)
    assert not out.eq(77).all()


def test_the_choice_is_checked_and_returned(restore_kernel: None) -> None:
    with pytest.raises(RuntimeError, match="must be 'auto', 'portable', 'avx2' or 'skip'"):
        torch.ops.fastpipe._jpeg_set_resize_kernel("sse9")
    assert torch.ops.fastpipe._jpeg_set_resize_kernel("portable") == "auto"
    assert torch.ops.fastpipe._jpeg_set_resize_kernel("auto") == "portable"
    if "avx2" not in _kernels():
        with pytest.raises(RuntimeError, match="no AVX2 kernel"):
            torch.ops.fastpipe._jpeg_set_resize_kernel("avx2")
