"""Device-side transforms: Normalize (torchvision's ToTensor + Normalize, fused) and the article's ConvertColorScale."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T

import fastpipe.transforms
from fastpipe.errors import ConfigError
from fastpipe.transforms.device import IMAGENET_MEAN, IMAGENET_STD, ConvertColorScale, Normalize
from fastpipe.workloads.toy.naive import ConvertColor, Scale


def naive(images: torch.Tensor) -> torch.Tensor:
    """The article's stages, one sample at a time, as its workers run them."""
    return torch.stack([Scale()(ConvertColor()(img.clone())) for img in images])


def batch(n: int = 6, height: int = 24, width: int = 40) -> torch.Tensor:
    images = torch.randint(0, 256, (n, 3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images[0, :, 0, :4] = torch.tensor(
        [[255, 0, 0, 128], [255, 0, 0, 128], [255, 0, 255, 128]], dtype=torch.uint8
    )  # white, black, blue, grey
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


def every_value_batch() -> torch.Tensor:
    """Every uint8 value in every channel, plus random pixels: (3, 3, 16, 32)."""
    ramp = torch.arange(256, dtype=torch.uint8).view(16, 16).repeat(1, 2)
    images = batch(3, 16, 32)
    images[0] = ramp
    images[1] = ramp.flip(0)
    return images


def torchvision_recipe(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """ToTensor() + Normalize(mean, std), per sample, on HWC arrays as a PIL-based pipeline feeds them."""
    recipe = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
    return torch.stack([recipe(img.permute(1, 2, 0).numpy()) for img in images])


@pytest.mark.parametrize(
    "mean, std", [(IMAGENET_MEAN, IMAGENET_STD), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), ((0.1, 0.9, 0.3), (0.3, 1.7, 0.31))]
)
def test_normalize_equals_torchvision_to_tensor_then_normalize(mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    images = every_value_batch()
    before = images.clone()
    out = Normalize(mean, std)(images)
    expected = torchvision_recipe(images, mean, std)
    assert out.dtype == torch.float32 and out.shape == expected.shape
    assert (out - expected).abs().max().item() <= 1e-6
    assert torch.equal(images, before)


def test_imagenet_preset_is_torchvisions_imagenet_recipe() -> None:
    images = every_value_batch()
    expected = torchvision_recipe(images, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert (Normalize.imagenet()(images) - expected).abs().max().item() <= 1e-6
    labels = torch.arange(3)
    out = Normalize.imagenet()((images, labels))
    assert isinstance(out, tuple) and out[1] is labels and (out[0] - expected).abs().max().item() <= 1e-6
    assert (Normalize.imagenet()(images[2]) - expected[2]).abs().max().item() <= 1e-6


def test_the_first_device_transform_a_user_finds_keeps_rgb() -> None:
    """Issue 14 item 5: the package's device-side normalization matches torchvision; the YCbCr one says what it does."""
    assert fastpipe.transforms.Normalize is Normalize
    assert fastpipe.transforms.__all__.index("Normalize") < fastpipe.transforms.__all__.index("ConvertColorScale")
    assert "COLOUR SPACE" in (ConvertColorScale.__doc__ or "")
    images = every_value_batch()
    ycbcr = ConvertColorScale()(images)
    assert (ycbcr - images.float() / 255).abs().max().item() > 0.1  # it really is not a plain rescale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_normalize_low_precision_is_the_float32_result_rounded_once(dtype: torch.dtype) -> None:
    images = every_value_batch()
    out = Normalize.imagenet(dtype)(images)
    assert out.dtype == dtype and torch.equal(out, Normalize.imagenet()(images).to(dtype))


def test_normalize_bad_arguments_say_what_to_pass() -> None:
    with pytest.raises(ConfigError, match="one mean and one std per channel"):
        Normalize((0.5, 0.5), (0.5,))
    with pytest.raises(ConfigError, match="positive stds"):
        Normalize((0.5,), (0.0,))
    with pytest.raises(ConfigError, match="dtype"):
        Normalize.imagenet(torch.int32)
    with pytest.raises(ConfigError, match="torchvision.transforms.Normalize"):
        Normalize.imagenet()(torch.rand(2, 3, 4, 4))
    with pytest.raises(ConfigError, match=r"\(N, 3, H, W\)"):
        Normalize.imagenet()(torch.zeros(2, 1, 4, 4, dtype=torch.uint8))
    grey = Normalize((0.5,), (0.25,))(torch.full((1, 1, 2, 2), 255, dtype=torch.uint8))
    assert torch.allclose(grey, torch.full((1, 1, 2, 2), 2.0))


@pytest.mark.gpu
def test_normalize_on_the_gpu_matches_cpu() -> None:
    images = every_value_batch()
    transform = Normalize.imagenet()
    on_gpu = transform(images.cuda())
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
    assert (on_gpu.cpu() - torchvision_recipe(images, IMAGENET_MEAN, IMAGENET_STD)).abs().max().item() <= 1e-6
