"""fastpipe::decode_jpeg_crop against PIL on the same boxes, every JPEG flavour, damaged files, opcheck, the fallbacks."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.library import opcheck

import fastpipe.ops.jpeg as jpeg
from fastpipe.errors import ConfigError, ExtensionUnavailableError

requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())

# The tolerances the module docstring states.
EXACT_MEAN, EXACT_MAX = 0.5, 3
SCALED_MEAN = 2.5


def _photo() -> Image.Image:
    """A real photograph when scikit-image is installed, else a smooth gradient with texture and noise."""
    try:
        from skimage import data

        return Image.fromarray(data.astronaut())
    except ImportError:
        y, x = np.mgrid[0:512, 0:512]
        rng = np.random.default_rng(0)
        base = np.stack([x / 2, y / 2, 128 + 80 * np.sin(x / 19.0) * np.cos(y / 13.0)], axis=-1)
        return Image.fromarray(np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8))


def _encode(image: Image.Image, **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


@pytest.fixture(scope="module")
def flavours() -> dict[str, bytes]:
    photo = _photo()
    return {
        "500x375 q90 4:2:0": _encode(photo.resize((500, 375)), quality=90),
        "375x500 q75 progressive": _encode(photo.resize((375, 500)), quality=75, progressive=True),
        "1200x800 q85": _encode(photo.resize((1200, 800)), quality=85),
        "333x500 q95 4:4:4": _encode(photo.resize((333, 500)), quality=95, subsampling=0),
        "500x375 greyscale": _encode(photo.resize((500, 375)).convert("L"), quality=88),
        "500x375 CMYK": _encode(photo.resize((500, 375)).convert("CMYK"), quality=90),
    }


def pil_reference(data: bytes, box: tuple[int, int, int, int], size: tuple[int, int], hflip: bool = False) -> np.ndarray:
    top, left, height, width = box
    out = (
        Image.open(io.BytesIO(data)).convert("RGB").resize((size[1], size[0]), Image.BILINEAR, box=(left, top, left + width, top + height))
    )
    if hflip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out).astype(np.int32)


def as_hwc(out: torch.Tensor) -> np.ndarray:
    assert out.dtype == torch.uint8 and out.dim() == 3 and out.shape[0] == 3
    return out.permute(1, 2, 0).numpy().astype(np.int32)


def unscaled_boxes(height: int, width: int) -> list[tuple[tuple[int, int, int, int], tuple[int, int]]]:
    """Boxes less than twice the output in some side, so no DCT scaling: enlarging, shrinking, odd offsets, every edge."""
    boxes = [
        ((0, 0, height, width), (224, 224)),  # the whole image, shrunk < 2x
        ((13, 27, 200, 150), (224, 224)),  # enlarged
        ((height - 101, width - 97, 101, 97), (224, 224)),  # the bottom-right corner: crop and skip at the edges
        ((height // 3, width // 4, height // 2, width // 2), (160, 200)),  # non-square output
        ((1, 3, 299, 329), (224, 224)),
    ]
    return [(box, size) for box, size in boxes if box[2] < 2 * size[0] or box[3] < 2 * size[1]]


@requires_op
@pytest.mark.parametrize(
    "name", ["500x375 q90 4:2:0", "375x500 q75 progressive", "1200x800 q85", "333x500 q95 4:4:4", "500x375 greyscale", "500x375 CMYK"]
)
def test_matches_pil_without_dct_scaling(flavours: dict[str, bytes], name: str) -> None:
    data = flavours[name]
    height, width = jpeg.jpeg_size(data)
    for box, size in unscaled_boxes(height, width):
        for hflip in (False, True):
            diff = np.abs(as_hwc(jpeg.decode_jpeg_crop(data, box, size, hflip)) - pil_reference(data, box, size, hflip))
            assert diff.mean() < EXACT_MEAN and diff.max() <= EXACT_MAX, (name, box, size, hflip, diff.mean(), diff.max())


def pil_draft_reference(data: bytes, box: tuple[int, int, int, int], size: tuple[int, int], scale: int) -> np.ndarray:
    """PIL's own DCT-scaled decode (Image.draft, the same libjpeg scaled IDCT), resized on box / scale."""
    im = Image.open(io.BytesIO(data))
    im.draft("RGB", (im.size[0] // scale, im.size[1] // scale))
    assert im.size[0] == -(-jpeg.jpeg_size(data)[1] // scale), "PIL did not decode at the expected DCT scale"
    top, left, height, width = box
    scaled_box = (left / scale, top / scale, (left + width) / scale, (top + height) / scale)
    return np.asarray(im.convert("RGB").resize((size[1], size[0]), Image.BILINEAR, box=scaled_box)).astype(np.int32)


@requires_op
@pytest.mark.parametrize("name", ["1200x800 q85", "375x500 q75 progressive", "500x375 greyscale"])
@pytest.mark.parametrize(
    ("box", "size", "scale"),
    [
        ((0, 0, 1.0, 1.0), (100, 100), 2),  # whole image (scale computed below for each file)
        ((0.05, 0.1, 0.6, 0.55), (64, 48), 4),
        ((0.1, 0.07, 0.85, 0.9), (24, 30), 8),
    ],
)
def test_dct_scaling_keeps_the_box_geometry(flavours: dict[str, bytes], name: str, box: tuple, size: tuple[int, int], scale: int) -> None:
    """With DCT scaling the op equals PIL's DCT-scaled decode on the scaled box (sub-pixel offsets kept)
    within the unscaled tolerance, and the full-size PIL path within SCALED_MEAN."""
    data = flavours[name]
    height, width = jpeg.jpeg_size(data)
    pixel_box = (int(box[0] * height), int(box[1] * width), int(box[2] * height), int(box[3] * width))
    chosen = max(s for s in (1, 2, 4, 8) if pixel_box[2] >= size[0] * s and pixel_box[3] >= size[1] * s)
    assert chosen > 1, "the parameters must exercise DCT scaling"
    out = as_hwc(jpeg.decode_jpeg_crop(data, pixel_box, size))
    same_decode = np.abs(out - pil_draft_reference(data, pixel_box, size, chosen))
    assert same_decode.mean() < EXACT_MEAN and same_decode.max() <= EXACT_MAX, (same_decode.mean(), same_decode.max())
    full_size = np.abs(out - pil_reference(data, pixel_box, size))
    assert full_size.mean() < SCALED_MEAN, full_size.mean()


@requires_op
@pytest.mark.parametrize("subsampling", [1, 2])  # 4:2:2 and 4:2:0: chroma interpolated across columns
def test_crop_windows_on_imcu_boundaries_match_pil(subsampling: int) -> None:
    """A box whose left or right side falls on a 16-pixel iMCU boundary: libjpeg's crop window then starts
    or ends exactly there, where fancy upsampling treats the window's edge as the image's edge."""
    data = _encode(_photo().resize((500, 375)), quality=90, subsampling=subsampling)
    for box in [(40, 32, 120, 96), (0, 16, 375, 64), (17, 48, 50, 80)]:
        for size in [(224, 224), (60, 64)]:
            diff = np.abs(as_hwc(jpeg.decode_jpeg_crop(data, box, size)) - pil_reference(data, box, size))
            assert diff.mean() < EXACT_MEAN and diff.max() <= EXACT_MAX, (box, size, diff.mean(), diff.max())


@requires_op
def test_random_boxes_sizes_and_flavours_match_pil() -> None:
    """Random image sizes (down to a few pixels), subsamplings, modes, boxes, output sizes and flips, against
    PIL on the same decode (its Image.draft at the op's DCT scale): crop windows that start or end at an
    iMCU boundary, skips to any row, extreme enlargements and shrinks."""
    rng = np.random.default_rng(5)
    photo = _photo()
    for trial in range(40):
        width, height = (int(v) for v in rng.integers(1, 400, 2))
        mode = str(rng.choice(["RGB", "RGB", "L", "CMYK"]))
        options = {"quality": int(rng.integers(50, 100)), "progressive": bool(rng.integers(0, 2))}
        if mode == "RGB":
            options["subsampling"] = int(rng.integers(0, 3))
        data = _encode(photo.resize((width, height)).convert(mode), **options)
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        box = (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
        size = (int(rng.integers(1, 160)), int(rng.integers(1, 160)))
        hflip = bool(rng.integers(0, 2))
        scale = max([1] + [s for s in (2, 4, 8) if h >= size[0] * s and w >= size[1] * s])
        expected = pil_draft_reference(data, box, size, scale) if scale > 1 else pil_reference(data, box, size)
        if hflip:
            expected = expected[:, ::-1]
        diff = np.abs(as_hwc(jpeg.decode_jpeg_crop(data, box, size, hflip)) - expected)
        assert diff.mean() < EXACT_MEAN and diff.max() <= EXACT_MAX, (
            trial,
            (width, height),
            mode,
            options,
            box,
            size,
            hflip,
            diff.mean(),
            diff.max(),
        )


@requires_op
def test_flip_and_greyscale_are_exact(flavours: dict[str, bytes]) -> None:
    data = flavours["500x375 greyscale"]
    box = (20, 30, 300, 280)
    plain = jpeg.decode_jpeg_crop(data, box, (224, 224))
    assert torch.equal(jpeg.decode_jpeg_crop(data, box, (224, 224), hflip=True), plain.flip(-1))
    assert torch.equal(plain[0], plain[1]) and torch.equal(plain[0], plain[2])  # as PIL's convert("RGB")


def test_sources_path_bytes_tensor_agree(flavours: dict[str, bytes], tmp_path: Path) -> None:
    data = flavours["500x375 q90 4:2:0"]
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    box = (10, 20, 200, 300)
    from_path = jpeg.decode_jpeg_crop(path, box, (64, 64))
    assert torch.equal(from_path, jpeg.decode_jpeg_crop(str(path), box, (64, 64)))
    assert torch.equal(from_path, jpeg.decode_jpeg_crop(data, box, (64, 64)))
    assert torch.equal(from_path, jpeg.decode_jpeg_crop(torch.frombuffer(bytearray(data), dtype=torch.uint8), box, (64, 64)))


def test_jpeg_size_reads_the_header(flavours: dict[str, bytes], tmp_path: Path) -> None:
    for name, data in flavours.items():
        width, height = Image.open(io.BytesIO(data)).size
        assert jpeg.jpeg_size(data) == (height, width), name
    png = tmp_path / "a.png"
    Image.new("RGB", (31, 17)).save(png)
    assert jpeg.jpeg_size(png) == (17, 31)
    # Markers before the frame header: EXIF (APP1), an ICC profile (APP2), a comment; the walk skips them.
    exif = Image.Exif()
    exif[0x010F] = "fastpipe test camera"
    photo = _photo().resize((321, 123))
    icc = b"\0" * 3000  # an opaque profile: only its length matters to the marker walk
    data = _encode(photo, quality=80, exif=exif.tobytes(), icc_profile=icc, comment=b"x" * 100)
    assert data[2:4] != b"\xff\xc0"
    assert jpeg.jpeg_size(data) == (123, 321)


@requires_op
def test_truncated_file_is_an_error_naming_the_file(flavours: dict[str, bytes], tmp_path: Path) -> None:
    data = flavours["500x375 q90 4:2:0"]
    path = tmp_path / "truncated.jpg"
    path.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(jpeg.CorruptImageError, match=r"truncated\.jpg.*(Premature end|corrupt|truncated)"):
        jpeg.decode_jpeg_crop(path, (0, 0, 375, 500), (224, 224))
    with pytest.raises(jpeg.CorruptImageError, match="truncated.jpg"):  # the header alone is cut
        path.write_bytes(data[:100])
        jpeg.decode_jpeg_crop(path, (0, 0, 10, 10), (8, 8))


@requires_op
def test_corrupt_scan_data_is_an_error(flavours: dict[str, bytes], tmp_path: Path) -> None:
    """Damaged entropy-coded data: libjpeg's warning becomes an error instead of grey or garbage rows."""
    data = bytearray(flavours["500x375 q90 4:2:0"])
    start = data.index(b"\xff\xda")  # start of scan
    rng = np.random.default_rng(1)
    data[start + 600 : start + 1400] = rng.integers(0, 256, 800, dtype=np.uint8).tobytes()
    path = tmp_path / "corrupt.jpg"
    path.write_bytes(bytes(data))
    with pytest.raises(
        jpeg.CorruptImageError, match=r"corrupt\.jpg: cannot decode the JPEG \(corrupt, truncated or unsupported\): Corrupt JPEG data"
    ):
        jpeg.decode_jpeg_crop(path, (0, 0, 375, 500), (224, 224))


def test_not_an_image_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.jpg"
    path.write_bytes(b"this is not an image at all")
    with pytest.raises(jpeg.CorruptImageError, match="notes.jpg"):
        jpeg.decode_jpeg_crop(path, (0, 0, 4, 4), (4, 4))


def test_box_outside_the_image_is_a_config_error(flavours: dict[str, bytes]) -> None:
    data = flavours["500x375 q90 4:2:0"]
    with pytest.raises(ConfigError, match="not inside the 375x500 image"):
        jpeg.decode_jpeg_crop(data, (100, 100, 300, 100), (32, 32))
    with pytest.raises(ConfigError, match="positive"):
        jpeg.decode_jpeg_crop(data, (0, 0, 10, 10), (0, 32))


def test_png_falls_back_to_pil_with_the_same_crop(tmp_path: Path) -> None:
    path = tmp_path / "photo.png"
    _photo().resize((300, 200)).save(path)
    box, size = (11, 23, 150, 170), (96, 80)
    assert jpeg.which_decoder(path) == "PIL"
    out = jpeg.decode_jpeg_crop(path, box, size, hflip=True)
    expected = np.asarray(
        Image.open(path).convert("RGB").resize((80, 96), Image.BILINEAR, box=(23, 11, 193, 161)).transpose(Image.FLIP_LEFT_RIGHT)
    )
    assert np.array_equal(as_hwc(out), expected.astype(np.int32))


def test_without_the_op_jpegs_decode_with_pil(flavours: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    data = flavours["500x375 CMYK"]
    monkeypatch.setattr(jpeg, "JPEG_OP_AVAILABLE", False)
    monkeypatch.setattr(jpeg, "JPEG_OP_LOAD_ERROR", ImportError("libjpeg.so.62: cannot open shared object file"))
    assert jpeg.which_decoder(data) == "PIL"
    box, size = (5, 6, 200, 300), (224, 224)
    assert np.array_equal(as_hwc(jpeg.decode_jpeg_crop(data, box, size)), pil_reference(data, box, size))
    with pytest.raises(ExtensionUnavailableError, match="libjpeg.so.62.*libjpeg62-turbo-dev"):
        jpeg.decode_jpeg_crop_op(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, 0, 10, 10, 8, 8)


def test_op_is_built_when_ci_requires_it() -> None:
    """.ci/run sets FASTPIPE_REQUIRE_EXT=1: there a missing fastpipe._jpeg is a failure, not a fallback."""
    if os.environ.get("FASTPIPE_REQUIRE_EXT") != "1":
        pytest.skip("FASTPIPE_REQUIRE_EXT is not 1; CI sets it to make the C++ libraries mandatory")
    assert jpeg.JPEG_OP_AVAILABLE, jpeg.jpeg_op_status()
    assert jpeg.which_decoder(b"\xff\xd8\xff\xe0") == "fastpipe._jpeg"


@requires_op
def test_opcheck(flavours: dict[str, bytes]) -> None:
    """Schema, fake kernel and dispatch as torch.library.opcheck sees them, with and without DCT scaling and flip."""
    for name in ("500x375 q90 4:2:0", "500x375 greyscale"):
        data = torch.frombuffer(bytearray(flavours[name]), dtype=torch.uint8)
        opcheck(torch.ops.fastpipe.decode_jpeg_crop.default, (data, 10, 20, 300, 400, 224, 224, False))
        opcheck(torch.ops.fastpipe.decode_jpeg_crop.default, (data, 0, 0, 375, 500, 64, 48, True))


@requires_op
def test_threads_decode_the_same_as_one(flavours: dict[str, bytes]) -> None:
    """Each thread keeps its own scratch buffers: concurrent calls on different files and boxes equal serial ones."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(data, (i, 2 * i, 150 + i, 120 + 3 * i), (64 + i, 96), i % 2 == 0) for i, data in enumerate(flavours.values())] * 3
    serial = [jpeg.decode_jpeg_crop(*job) for job in jobs]
    with ThreadPoolExecutor(3) as pool:
        concurrent = list(pool.map(lambda job: jpeg.decode_jpeg_crop(*job), jobs))
    assert all(torch.equal(a, b) for a, b in zip(serial, concurrent))


@requires_op
@pytest.mark.parametrize("name", ["500x375 q90 4:2:0", "333x500 q95 4:4:4", "500x375 greyscale", "500x375 CMYK", "512x512 q90 4:2:0"])
def test_entropy_floor_covers_whole_imcu_rows_above_the_bottom(flavours: dict[str, bytes], name: str) -> None:
    """bench_jpeg's floor decodes every whole iMCU row above the box's bottom, as libjpeg counts them.

    The op returns libjpeg's own count of the rows it consumed, so a skip that decoded nothing
    (libjpeg-turbo's shortcut when asked to skip to the very end) would show as too few rows.
    """
    data = jpeg.read_bytes(flavours[name] if name in flavours else _encode(_photo().resize((512, 512)), quality=90))
    height, _ = jpeg.jpeg_size(data)
    imcu = 8 if "4:4:4" in name or "greyscale" in name else 16
    for bottom in (1, 17, 100, 231, height - 1, height):
        covered = torch.ops.fastpipe._jpeg_entropy_floor(data, bottom)
        assert covered == (bottom // imcu) * imcu, (name, bottom, covered)


@requires_op
def test_entropy_floor_reads_every_scan_of_a_progressive_file(flavours: dict[str, bytes]) -> None:
    data = jpeg.read_bytes(flavours["375x500 q75 progressive"])
    assert torch.ops.fastpipe._jpeg_entropy_floor(data, 40) == jpeg.jpeg_size(data)[0]
    with pytest.raises(RuntimeError, match="cannot decode"):
        torch.ops.fastpipe._jpeg_entropy_floor(data[:200].clone(), 40)
