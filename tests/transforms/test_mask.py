"""fastpipe.transforms.RandomMask: every backend equals the naive scipy path on the same draw, and draws right."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torchvision.transforms as T

from fastpipe.errors import ConfigError
from fastpipe.ops import EXTENSION_AVAILABLE, extension_status
from fastpipe.transforms import RandomMask, _numba_kernels, _prng, apply_mask, backend_available, draw_mask, random_mask, resolve_backend
from fastpipe.transforms.mask import AUTO_ORDER, BACKENDS
from fastpipe.workloads.toy.naive import RandomMask as NaiveRandomMask

BACKEND_PARAMS = [
    pytest.param("numpy"),
    pytest.param("numba"),
    pytest.param("cpp", marks=pytest.mark.skipif(not EXTENSION_AVAILABLE, reason=extension_status())),
]
DILATED_INTERIOR = {ratio: 1 - (1 - ratio) ** 5 for ratio in (0.1, 0.25, 0.5)}  # a pixel survives if it and its 4 neighbours do


def naive_masked(img: torch.Tensor, draw: np.ndarray) -> torch.Tensor:
    """The article's kernel on a given draw: scipy's convolve2d dilation, then ``img[dilated] = 0``, on a copy."""
    out = img.clone()
    dilated = torch.from_numpy(NaiveRandomMask().dilate_mask(draw))
    out[dilated.expand(out.shape) if out.dim() == 3 else dilated] = 0
    return out


def layouts() -> dict[str, object]:
    """The images RandomMask takes, 20x30 each, built afresh (same pixels) on every call, views included."""
    gen = torch.Generator().manual_seed(0)
    chw = torch.randint(1, 256, (3, 20, 30), dtype=torch.uint8, generator=gen)
    big_hwc = torch.randint(1, 256, (40, 50, 3), dtype=torch.uint8, generator=gen)
    return {
        "chw tensor": chw,
        "crop view of a CHW tensor": torch.randint(1, 256, (3, 40, 50), dtype=torch.uint8, generator=gen)[:, 5:25, 7:37],
        "CHW view of HWC memory": big_hwc.permute(2, 0, 1)[:, 5:25, 7:37],
        "hwc array": chw.permute(1, 2, 0).numpy().copy(),
        "crop of an hwc array": big_hwc.numpy()[5:25, 7:37],
        "grey (H, W) tensor": chw[0].clone(),
        "float32 chw tensor": chw.float(),
        "4-channel hwc array": torch.randint(1, 256, (20, 30, 4), dtype=torch.uint8, generator=gen).numpy(),
    }


def as_chw(img: object) -> torch.Tensor:
    return img if isinstance(img, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("ratio", [0.25, 0.1])
@pytest.mark.parametrize("name", list(layouts()))
def test_every_backend_equals_naive_scipy_on_the_same_draw(backend: str, ratio: float, name: str) -> None:
    img = layouts()[name]
    reference_input = as_chw(img).clone()
    draw = draw_mask(20, 30, ratio, seed=1234)
    expected = naive_masked(reference_input, draw)
    assert not torch.equal(expected, reference_input), "the draw must mask something for the test to mean anything"

    # out of place: the input is untouched and the result is compact
    for out in (apply_mask(img, draw, backend=backend, inplace=False), random_mask(img, ratio, seed=1234, backend=backend, inplace=False)):
        assert torch.equal(as_chw(out), expected)
        assert out is not img and (out.is_contiguous() if isinstance(out, torch.Tensor) else out.flags.c_contiguous)
    assert torch.equal(as_chw(img), reference_input)

    # in place, as the article's transform: the caller's object is masked and returned
    for run in (lambda x: apply_mask(x, draw, backend=backend), lambda x: random_mask(x, ratio, seed=1234, backend=backend)):
        target = layouts()[name]
        assert run(target) is target
        assert torch.equal(as_chw(target), expected)


def test_in_place_writes_through_a_crop_view_like_the_article() -> None:
    """After PILToTensor + RandomCrop the mask sees a view; the naive ``img[mask] = 0`` writes into the parent."""
    parent = torch.full((3, 16, 16), 7, dtype=torch.uint8)
    view = parent[:, 4:12, 2:10]
    random_mask(view, 0.5, seed=3)
    assert (parent[:, 4:12, 2:10] == 0).any() and (parent[:, :4] == 7).all()


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.1, 1 / 16, 0.75, 3 / 256, 0.0, 1.0, 1 / 3])
@pytest.mark.parametrize("shape", [(256, 256), (37, 29), (5, 1), (1, 70), (7, 33)])
def test_compiled_draws_equal_the_numpy_draw(ratio: float, shape: tuple[int, int]) -> None:
    """The shared SplitMix64 stream: numba's and C++'s draws are NumPy's, bit for bit."""
    bits, threshold = _prng.quantize_ratio(ratio)
    expected = _prng.draw_bits_numpy(*shape, ratio, 99)
    assert np.array_equal(_numba_kernels.draw_mask(*shape, 99, bits, threshold).astype(bool), expected)
    if EXTENSION_AVAILABLE:
        from fastpipe.ops import draw_mask as cpp_draw_mask

        assert np.array_equal(cpp_draw_mask(*shape, ratio, 99).numpy().astype(bool), expected)


def test_splitmix_stream_is_splitmix64() -> None:
    """Word 0 for seed 0 is SplitMix64's first output for state 0, a published constant."""
    assert int(_prng.splitmix_words(0, 1)[0]) == 0xE220A8397B1DCDAF
    assert int(_numba_kernels.splitmix_word(np.uint64(0), np.uint64(0))) == 0xE220A8397B1DCDAF


def test_quantize_ratio() -> None:
    assert _prng.quantize_ratio(0.25) == (2, 1)  # masked when a 2-bit chunk is 0: 32 draws per word
    assert _prng.quantize_ratio(0.5) == (1, 1)
    assert _prng.quantize_ratio(0.75) == (2, 3)
    assert _prng.quantize_ratio(0.1) == (16, 6554)
    assert abs(_prng.effective_ratio(0.1) - 0.1) < 1e-5
    assert _prng.quantize_ratio(0.0) == (1, 0) and _prng.quantize_ratio(1.0) == (1, 2)
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ConfigError, match="ratio"):
            _prng.quantize_ratio(bad)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("ratio", sorted(DILATED_INTERIOR))
def test_masked_fraction_matches_the_dilated_bernoulli(backend: str, ratio: float) -> None:
    """The fused path with seeds from np.random: the article's statistic, for every backend."""
    np.random.seed(7)
    fractions = []
    for _ in range(4):
        img = torch.full((3, 256, 256), 200, dtype=torch.uint8)
        out = RandomMask(ratio, backend=backend)(img)
        assert out is img and torch.equal(out[0] == 0, out[1] == 0) and torch.equal(out[0] == 0, out[2] == 0)
        fractions.append((out[0, 1:-1, 1:-1] == 0).float().mean().item())
    assert np.mean(fractions) == pytest.approx(DILATED_INTERIOR[ratio], abs=0.006)
    draw = draw_mask(512, 512, ratio)
    assert draw.mean() == pytest.approx(ratio, abs=0.004)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_draws_come_from_numpy_global_rng(backend: str) -> None:
    """np.random.seed reproduces a mask (the DataLoader seeds each worker's np.random differently); calls differ."""
    transform = RandomMask(0.25, backend=backend)
    masks = []
    for seed in (5, 5, 6):
        np.random.seed(seed)
        masks.append(transform(torch.full((1, 64, 64), 9, dtype=torch.uint8)) == 0)
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], masks[2])
    np.random.seed(5)
    first, second = (transform(torch.full((1, 64, 64), 9, dtype=torch.uint8)) == 0 for _ in range(2))
    assert not torch.equal(first, second)


def test_plain_python_kernels_with_jit_disabled() -> None:
    """FASTPIPE_DISABLE_JIT=1: the numba backend runs as plain Python and still equals the NumPy backend."""
    script = textwrap.dedent(
        """
        import numpy as np, torch
        from fastpipe.transforms import _jit, _numba_kernels, random_mask, resolve_backend, uniform_noise
        assert _jit.JIT_DISABLED and not hasattr(_numba_kernels.mask_planar, "py_func"), "kernels must be plain functions"
        assert resolve_backend("auto") != "numba", "auto must not pick the slow Python kernels"
        img = torch.randint(0, 256, (3, 9, 70), dtype=torch.uint8)
        hwc = img.permute(1, 2, 0).numpy().copy()
        for ratio in (0.25, 0.1):
            expected = random_mask(img, ratio, seed=11, backend="numpy", inplace=False)
            assert torch.equal(random_mask(img, ratio, seed=11, backend="numba", inplace=False), expected)
            out = random_mask(hwc.copy(), ratio, seed=11, backend="numba")
            assert np.array_equal(out.transpose(2, 0, 1), expected.numpy())
        assert np.array_equal(uniform_noise((5, 7, 3), seed=3, backend="numba"), uniform_noise((5, 7, 3), seed=3, backend="numpy"))
        print("plain python ok")
        """
    )
    env = {**os.environ, "FASTPIPE_DISABLE_JIT": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "plain python ok" in result.stdout


def test_auto_picks_the_first_available_backend_in_speed_order() -> None:
    expected = next(name for name in AUTO_ORDER if backend_available(name))
    assert resolve_backend("auto") == expected
    assert RandomMask().backend == expected
    assert set(BACKENDS) == {"numpy", "numba", "cpp"}


def test_unavailable_cpp_backend_says_how_to_rebuild(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastpipe.ops as ops
    from fastpipe.errors import ExtensionUnavailableError
    from fastpipe.transforms import mask

    monkeypatch.setattr(ops, "EXTENSION_AVAILABLE", False)
    monkeypatch.setattr(ops, "EXTENSION_LOAD_ERROR", ImportError("libfastpipe missing"))
    mask.backend_available.cache_clear()
    try:
        with pytest.raises(ExtensionUnavailableError, match="pip install --no-build-isolation"):
            RandomMask(backend="cpp")
        assert resolve_backend("auto") == "numba"  # falls back, as the foundation's extension loader promises
    finally:
        mask.backend_available.cache_clear()


def test_bad_inputs_raise_config_errors_that_say_what_to_do() -> None:
    from PIL import Image

    with pytest.raises(ConfigError, match="backend"):
        RandomMask(backend="cuda")
    with pytest.raises(ConfigError, match="PILToTensor"):
        random_mask(Image.new("RGB", (4, 4)))
    with pytest.raises(ConfigError, match="read-only"):
        random_mask(np.asarray(Image.new("RGB", (4, 4))))
    assert random_mask(np.asarray(Image.new("RGB", (4, 4))), inplace=False).flags.writeable
    with pytest.raises(ConfigError, match="per sample"):
        random_mask(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="does not match"):
        apply_mask(torch.zeros(3, 4, 4, dtype=torch.uint8), np.zeros((4, 5), bool))
    with pytest.raises(ConfigError, match="seed"):
        random_mask(torch.zeros(3, 4, 4, dtype=torch.uint8), seed=-1)


def test_drop_in_for_the_article_compose() -> None:
    """Swapped into the article's Compose, the fast mask keeps shapes, dtypes and the in-place contract."""
    from fastpipe.workloads.toy.naive import ConvertColor, Scale

    np.random.seed(0)
    compose = T.Compose([T.PILToTensor(), T.RandomCrop(32), RandomMask(0.25), ConvertColor(), Scale()])
    from PIL import Image

    out = compose(Image.fromarray(np.random.randint(0, 256, (64, 64, 3), dtype=np.uint8)))
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert "backend=" in repr(RandomMask()) and RandomMask().warm_up() is not None


@pytest.mark.skipif(not backend_available("numba"), reason="numba is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("inplace", [True, False])
def test_numba_zeroes_floats_through_their_bits_like_a_select(dtype: torch.dtype, inplace: bool) -> None:
    """Float images are masked through an unsigned view of their bits (branch-free on any CPU).

    That must match the numpy backend's select exactly: masked pixels become +0.0 (NaN and inf
    too), unmasked ones keep every bit, -0.0 and NaN included.
    """
    image = torch.rand(3, 40, 48).to(dtype)
    image[0, ::3, ::5] = float("nan")
    image[1, 1::4, ::2] = -0.0
    image[2, ::7, 1::3] = float("inf")
    expected = apply_mask(image.clone(), draw_mask(40, 48, 0.25, seed=11), backend="numpy", inplace=True)
    got = random_mask(image.clone() if inplace else image, 0.25, seed=11, backend="numba", inplace=inplace)
    bits = {torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}[dtype]
    assert torch.equal(got.view(bits), expected.view(bits))
    assert (got == 0).any() and got.isnan().any() and (got.view(bits) == torch.tensor(-0.0, dtype=dtype).view(bits)).any()


@pytest.mark.skipif(not backend_available("numba"), reason="numba is not installed")
@pytest.mark.parametrize("channels", [1, 2, 4])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32])
def test_numba_interleaved_images_of_any_channel_count_match_numpy(channels: int, dtype: type) -> None:
    """HWC arrays that are not RGB take the spread-and-multiply path; they must equal the numpy backend."""
    image = (np.random.default_rng(0).random((40, 48, channels)) * 100).astype(dtype)
    expected = apply_mask(image.copy(), draw_mask(40, 48, 0.25, seed=3), backend="numpy")
    assert (expected == 0).any() and (expected != 0).any()
    for inplace in (True, False):
        got = random_mask(image.copy(), 0.25, seed=3, backend="numba", inplace=inplace)
        assert np.array_equal(got, expected), inplace
