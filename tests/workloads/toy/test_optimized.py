"""The toy workload's optimized variants, FastFakeDataset and uniform_noise."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fastpipe.devices import parse_device
from fastpipe.errors import ConfigError
from fastpipe.stages import split_transform
from fastpipe.transforms import ConvertColorScale, RandomMask, uniform_noise
from fastpipe.transforms.convert import ToCHWTensor
from fastpipe.workloads.toy import VARIANTS, FastFakeDataset, make_workload, optimized_transform
from fastpipe.workloads.toy.optimized import FAST_RAW, OPTIMIZED, UINT8_HOST, VARIANT_OPTIMIZATIONS

LADDER = ["fast-transforms", "uint8-host", "prefetch", "fast-raw", "optimized"]


def test_variants_are_registered_in_ladder_order() -> None:
    assert list(VARIANT_OPTIMIZATIONS) == [*LADDER, "crop-first", "recycled"]
    assert VARIANT_OPTIMIZATIONS["crop-first"] == replace(VARIANT_OPTIMIZATIONS["optimized"], prefetch=False)
    assert VARIANT_OPTIMIZATIONS["recycled"] == replace(VARIANT_OPTIMIZATIONS["optimized"], recycled=True)
    assert all(name in VARIANTS for name in ["naive", *LADDER])
    flags = [VARIANT_OPTIMIZATIONS[name] for name in LADDER]
    for before, after in zip(flags, flags[1:]):  # cumulative: each step keeps every fix of the one before
        assert all(getattr(after, f) >= getattr(before, f) for f in ("fast_mask", "uint8_host", "prefetch", "fast_raw", "crop_first"))


@pytest.mark.parametrize("variant", LADDER)
def test_each_variant_builds_and_yields_article_batches(variant: str, small_toy_options: dict) -> None:
    workload = make_workload(variant, parse_device("sim:5"), **small_toy_options)
    images, labels = next(iter(workload.loader))
    assert images.shape == (4, 3, 32, 32) and labels.shape == (4,)
    opts = VARIANT_OPTIMIZATIONS[variant]
    assert workload.name == f"toy:{variant}"
    assert workload.prefetch_depth == (2 if opts.prefetch else 0)
    if opts.uint8_host:
        assert images.dtype == torch.uint8 and isinstance(workload.device_transform, ConvertColorScale)
        on_device = workload.device_transform((images, labels))[0]
        assert on_device.dtype == torch.float32 and 0 <= on_device.min() and on_device.max() <= 1 + 1e-6
        assert any("simulated step time" in note for note in workload.notes)
    else:
        assert images.dtype == torch.float32 and workload.device_transform is None


def test_stages_are_the_naive_ones_with_the_fixes_swapped_in() -> None:
    names = lambda opts: [stage.name for stage in split_transform(optimized_transform(opts, 32))]  # noqa: E731
    assert names(VARIANT_OPTIMIZATIONS["fast-transforms"]) == ["RandomCrop", "PILToTensor", "RandomMask", "ConvertColor", "Scale"]
    assert names(UINT8_HOST) == ["RandomCrop", "PILToTensor", "RandomMask"]
    assert names(FAST_RAW) == ["ToCHWTensor", "RandomCrop", "RandomMask"]
    assert names(OPTIMIZED) == ["ToCHWTensor", "RandomMask"]
    mask = optimized_transform(OPTIMIZED, 32).transforms[-1]
    assert isinstance(mask, RandomMask) and not mask.inplace  # writes the compact CHW copy in its single pass


@pytest.mark.parametrize("opts", [UINT8_HOST, FAST_RAW, OPTIMIZED], ids=["uint8-host", "fast-raw", "optimized"])
def test_optimized_samples_have_the_naive_distribution(opts) -> None:  # type: ignore[no-untyped-def]
    """Masked fraction ~ 1 - 0.75**5, unmasked pixels uniform on 1..255, CHW uint8, compact."""
    from fastpipe.workloads.toy import FakeDataset

    np.random.seed(0)
    torch.manual_seed(0)
    transform = optimized_transform(opts, 64)
    sizes = dict(length=8, raw_size=(128, 128))
    dataset = (
        FakeDataset(transform, **sizes)
        if not (opts.fast_raw or opts.crop_first)
        else FastFakeDataset(transform, crop_size=64 if opts.crop_first else None, **sizes)
    )
    samples = torch.stack([dataset[i][0] for i in range(8)])
    assert samples.dtype == torch.uint8 and samples.shape == (8, 3, 64, 64) and dataset[0][0].is_contiguous()
    masked = (samples == 0).all(dim=1)[:, 1:-1, 1:-1].float().mean().item()
    assert masked == pytest.approx(1 - 0.75**5, abs=0.015)
    kept = samples[samples != 0].float()
    assert kept.mean().item() == pytest.approx(128.0, abs=1.5)  # uniform on 1..255


def test_crop_first_draws_the_crop_like_random_crop() -> None:
    dataset = FastFakeDataset(length=4, raw_size=(100, 80), crop_size=(30, 20))
    torch.manual_seed(1)
    boxes = [dataset.crop_box() for _ in range(200)]
    assert all(0 <= top <= 70 and 0 <= left <= 60 and (h, w) == (30, 20) for top, left, h, w in boxes)
    assert len({(top, left) for top, left, _, _ in boxes}) > 100
    img, label = dataset[0]
    assert img.shape == (30, 20, 3) and img.dtype == np.uint8 and 0 <= label < 10
    assert FastFakeDataset(length=1, raw_size=(40, 50))[0][0].shape == (40, 50, 3)
    for bad in (0, 101, (30, 90)):
        with pytest.raises(ConfigError, match="crop_size"):
            FastFakeDataset(raw_size=(100, 80), crop_size=bad)


def test_uniform_noise_is_uniform_and_backends_agree() -> None:
    a = uniform_noise((257, 131, 3), seed=42, backend="numba")
    assert a.dtype == np.uint8 and a.shape == (257, 131, 3) and a.flags.c_contiguous
    assert np.array_equal(a, uniform_noise((257, 131, 3), seed=42, backend="numpy"))
    assert not np.array_equal(a, uniform_noise((257, 131, 3), seed=43))
    counts = np.bincount(uniform_noise((1 << 20,), seed=7).ravel(), minlength=256)
    expected = (1 << 20) / 256
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 350  # 255 degrees of freedom: the 99.9th percentile is ~330 .. 350
    pairs = uniform_noise((1 << 20,), seed=8).astype(np.int64)
    assert abs(np.corrcoef(pairs[:-1], pairs[1:])[0, 1]) < 0.01  # neighbouring bytes independent
    with pytest.raises(ConfigError, match="backend"):
        uniform_noise((2,), backend="cpp")


def test_to_chw_tensor_shares_memory() -> None:
    hwc = uniform_noise((4, 5, 3), seed=1)
    chw = ToCHWTensor()(hwc)
    assert chw.shape == (3, 4, 5) and chw.data_ptr() == hwc.ctypes.data
    assert ToCHWTensor(contiguous=True)(hwc).is_contiguous()
    with pytest.raises(ConfigError, match="numpy array"):
        ToCHWTensor()(torch.zeros(3, 4, 5))


def test_img_size_larger_than_raw_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="img_size"):
        make_workload("optimized", parse_device("sim:5"), raw_size=32, img_size=64, length=4)


def test_workers_draw_independent_masks_and_noise(small_toy_options: dict) -> None:
    """Seeds come from each worker's np.random, which the DataLoader seeds per worker."""
    options = {**small_toy_options, "num_workers": 2, "batch_size": 2, "length": 4}
    workload = make_workload("optimized", parse_device("sim:5"), **options)
    first, second = (images for images, _ in workload.loader)  # batch 0 from worker 0, batch 1 from worker 1
    assert not torch.equal(first, second)
    assert not torch.equal(first[0] == 0, second[0] == 0)


def test_cropping_the_pil_image_first_gives_the_same_crop() -> None:
    import torchvision.transforms as T
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, size=(300, 280, 3), dtype=np.uint8))
    torch.manual_seed(7)
    tensor_first = T.RandomCrop(64)(T.PILToTensor()(img))
    torch.manual_seed(7)
    pil_first = T.PILToTensor()(T.RandomCrop(64)(img))
    assert torch.equal(tensor_first, pil_first)
