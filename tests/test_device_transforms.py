"""ConvertColorScale: the naive per-sample ConvertColor + Scale, as one batched expression on the device."""
from __future__ import annotations

import pytest
import torch

from fastpipe.errors import ConfigError
from fastpipe.toy.naive import ConvertColor, Scale
from fastpipe.transforms.device import ConvertColorScale


def naive(images: torch.Tensor) -> torch.Tensor:
    """The article's stages, one sample at a time, as its workers run them."""
    return torch.stack([Scale()(ConvertColor()(img.clone())) for img in images])


def batch(n: int = 6, height: int = 24, width: int = 40) -> torch.Tensor:
    images = torch.randint(0, 256, (n, 3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images[0, :, 0, :4] = torch.tensor([[255, 0, 0, 128], [255, 0, 0, 128], [255, 0, 255, 128]], dtype=torch.uint8)  # white, black, blue, grey
    return images


def test_float32_equals_naive_convert_color_then_scale() -> None:
    images = batch()
    before = images.clone()
    out = ConvertColorScale()(images)
    assert out.dtype == torch.float32 and out.shape == images.shape
    assert (out - naive(images)).abs().max().item() <= 1e-5
    assert torch.equal(images, before)  # the uint8 batch is not modified


def test_unbatched_image_and_loader_tuples() -> None:
    images, labels = batch(3), torch.tensor([1, 2, 3])
    transform = ConvertColorScale()
    assert (transform(images[1]) - naive(images[1:2])[0]).abs().max().item() <= 1e-5
    out = transform((images, labels))
    assert isinstance(out, tuple) and out[1] is labels and (out[0] - naive(images)).abs().max().item() <= 1e-5
    as_list = transform([images, labels])
    assert isinstance(as_list, list) and as_list[1] is labels


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_output_is_the_float32_result_rounded_once(dtype: torch.dtype) -> None:
    images = batch()
    out = ConvertColorScale(dtype)(images)
    assert out.dtype == dtype
    assert torch.equal(out, ConvertColorScale()(images).to(dtype))
    assert (out.float() - naive(images)).abs().max().item() <= 1 / 128  # bf16 keeps 8 significant bits of values in [0, 1]


def test_other_colour_matrices() -> None:
    identity = ConvertColorScale(matrix=torch.eye(3), offset=(0.0, 0.0, 0.0))
    images = batch(2)
    assert torch.allclose(identity(images), images.float() / 255, atol=1e-7)


def test_bad_arguments_say_what_to_pass() -> None:
    with pytest.raises(ConfigError, match="dtype"):
        ConvertColorScale(torch.int8)
    with pytest.raises(ConfigError, match="3x3"):
        ConvertColorScale(matrix=torch.eye(4))
    with pytest.raises(ConfigError, match=r"\(N, 3, H, W\)"):
        ConvertColorScale()(torch.zeros(2, 4, 8, 8, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="tuple"):
        ConvertColorScale()({"images": batch(1)})


@pytest.mark.gpu
def test_runs_on_the_tensors_device_and_matches_cpu() -> None:
    images = batch()
    transform = ConvertColorScale()
    on_gpu = transform(images.cuda(non_blocking=True))
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
    assert (on_gpu.cpu() - transform(images)).abs().max().item() <= 1e-5
    assert ConvertColorScale(torch.bfloat16)(images.cuda()).dtype == torch.bfloat16
