"""fastpipe's C++ ops: loaded in CI, registered correctly (opcheck), equal to the plain reference."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.library import opcheck

import fastpipe.ops as ops
from fastpipe.errors import ConfigError, ExtensionUnavailableError
from fastpipe.transforms import _prng
from fastpipe.workloads.toy.naive import RandomMask as NaiveRandomMask

requires_ext = pytest.mark.skipif(not ops.EXTENSION_AVAILABLE, reason=ops.extension_status())


def test_extension_is_loaded_when_ci_requires_it() -> None:
    """.ci/run sets FASTPIPE_REQUIRE_EXT=1: there, a missing library is a failure, not a skip."""
    if os.environ.get("FASTPIPE_REQUIRE_EXT") != "1":
        pytest.skip("FASTPIPE_REQUIRE_EXT is not 1; CI sets it to make the C++ library mandatory")
    assert ops.EXTENSION_AVAILABLE, ops.extension_status()
    assert hasattr(torch.ops.fastpipe, "random_mask_")


def test_missing_library_raises_with_rebuild_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "EXTENSION_AVAILABLE", False)
    monkeypatch.setattr(ops, "EXTENSION_LOAD_ERROR", OSError("undefined symbol: _ZN3c10"))
    with pytest.raises(ExtensionUnavailableError, match="undefined symbol.*pip install --no-build-isolation -e ."):
        ops.random_mask_(torch.zeros(3, 4, 4, dtype=torch.uint8), 0.25, 1)
    assert "not loaded" in ops.extension_status()


def reference(img: torch.Tensor, ratio: float, seed: int) -> torch.Tensor:
    """NumPy's draw of the shared stream, scipy's dilation, ``img[dilated] = 0``: the article's kernel."""
    draw = _prng.draw_bits_numpy(img.shape[-2], img.shape[-1], ratio, seed)
    out = img.clone()
    dilated = torch.from_numpy(NaiveRandomMask().dilate_mask(draw))
    out[dilated.expand(out.shape) if out.dim() == 3 else dilated] = 0
    return out


def sample_images() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    rgb = torch.randint(1, 256, (3, 17, 70), dtype=torch.uint8, generator=gen)
    return {
        "contiguous uint8": rgb,
        "crop view": torch.randint(1, 256, (3, 40, 90), dtype=torch.uint8, generator=gen)[:, 3:20, 10:80],
        "HWC memory": rgb.permute(1, 2, 0).contiguous().permute(2, 0, 1),
        "grey (H, W)": rgb[0].clone(),
        "float32": rgb.float(),
        "bfloat16": rgb.to(torch.bfloat16),
        "int64, 5 channels": torch.randint(1, 1000, (5, 17, 70), dtype=torch.int64, generator=gen),
    }


@requires_ext
@pytest.mark.parametrize("name", list(sample_images()))
@pytest.mark.parametrize("ratio", [0.25, 0.1, 1.0])
def test_ops_equal_the_reference(name: str, ratio: float) -> None:
    img = sample_images()[name]
    expected = reference(img, ratio, 77)

    inplace = sample_images()[name]
    ops.random_mask_(inplace, ratio, 77)
    assert torch.equal(inplace, expected)

    applied = sample_images()[name]
    ops.apply_mask_(applied, torch.from_numpy(_prng.draw_bits_numpy(img.shape[-2], img.shape[-1], ratio, 77)))
    assert torch.equal(applied, expected)

    source = sample_images()[name]
    out = torch.empty(img.shape, dtype=img.dtype)
    ops.random_mask_out(source, ratio, 77, out)
    assert torch.equal(out, expected) and torch.equal(source, img)  # out of place leaves the source alone

    assert np.array_equal(
        ops.draw_mask(img.shape[-2], img.shape[-1], ratio, 77).numpy().astype(bool),
        _prng.draw_bits_numpy(img.shape[-2], img.shape[-1], ratio, 77),
    )


@requires_ext
@pytest.mark.parametrize("name", ["contiguous uint8", "crop view", "HWC memory", "grey (H, W)", "float32"])
def test_opcheck(name: str) -> None:
    """Schemas, fake kernels, autograd registration and AOT dispatch, as torch.library.opcheck sees them."""
    img = sample_images()[name]
    height, width = img.shape[-2:]
    opcheck(torch.ops.fastpipe.random_mask_.default, (img.clone(), 0.25, 5))
    opcheck(torch.ops.fastpipe.apply_mask_.default, (img.clone(), torch.rand(height, width) < 0.2))
    opcheck(torch.ops.fastpipe.random_mask_out.default, (img, 0.25, 5, torch.empty(img.shape, dtype=img.dtype)))
    opcheck(torch.ops.fastpipe.draw_mask_.default, (torch.empty(height, width, dtype=torch.uint8), 0.25, 5))


@requires_ext
def test_ops_reject_bad_arguments() -> None:
    img = torch.zeros(3, 8, 8, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="ratio must be in"):
        ops.random_mask_(img, 1.5, 1)
    with pytest.raises(RuntimeError, match="seed must be in"):
        ops.random_mask_(img, 0.25, -3)
    with pytest.raises(RuntimeError, match=r"\(C, H, W\) or \(H, W\)"):
        ops.random_mask_(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), 0.25, 1)
    with pytest.raises(RuntimeError, match="mask must be"):
        ops.apply_mask_(img, torch.zeros(8, 9, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="out must be"):
        ops.random_mask_out(img, 0.25, 1, torch.empty(3, 8, 9, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="single memory location"):
        ops.random_mask_out(img, 0.25, 1, img)


@requires_ext
@pytest.mark.gpu
def test_ops_are_cpu_only_and_say_so() -> None:
    """fastpipe's one-line message, raised before dispatch (not torch's 40-line "Could not run ... 'CUDA' backend")."""
    cuda = torch.zeros(3, 8, 8, dtype=torch.uint8, device="cuda")
    with pytest.raises(ConfigError, match="img must be a CPU tensor, got one on cuda"):
        ops.random_mask_(cuda, 0.25, 1)
    with pytest.raises(ConfigError, match="out must be a CPU tensor, got one on cuda"):
        ops.random_mask_out(cuda.cpu(), 0.25, 1, cuda)
    if ops.JPEG_OP_AVAILABLE:
        with pytest.raises(ConfigError, match="source must be a CPU tensor, got one on cuda"):
            ops.decode_jpeg_crop(torch.zeros(100, dtype=torch.uint8, device="cuda"), (0, 0, 4, 4), (4, 4))
