"""Fidelity of the naive toy workload to the article (toy_workload.md)."""

import numpy as np
import pytest
import torch
from PIL import Image

from fastpipe.workloads.toy import ConvertColor, FakeDataset, RandomMask, Scale, naive_transform


def brute_force_dilation(mask: np.ndarray) -> np.ndarray:
    height, width = mask.shape
    out = np.zeros_like(mask, dtype=bool)
    for y in range(height):
        for x in range(width):
            for dy, dx in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
                yy, xx = y + dy, x + dx
                if 0 <= yy < height and 0 <= xx < width and mask[yy, xx]:
                    out[y, x] = True
    return out


def test_raw_sample_and_label() -> None:
    np.random.seed(0)
    dataset = FakeDataset(transform=None, length=5, raw_size=(1024, 1024))
    img, label = dataset[0]
    assert isinstance(img, Image.Image) and img.size == (1024, 1024) and img.mode == "RGB"
    assert len(dataset) == 5
    labels = [dataset[i][1] for i in range(5) for _ in range(40)]
    assert all(isinstance(label, int) and 0 <= label < 10 for label in labels)
    assert set(labels) == set(range(10))


def test_article_defaults() -> None:
    dataset = FakeDataset()
    assert len(dataset) == 10_000 and dataset.raw_size == (1024, 1024) and dataset.num_classes == 10
    stages = [type(t).__name__ for t in naive_transform().transforms]
    assert stages == ["PILToTensor", "RandomCrop", "RandomMask", "ConvertColor", "Scale"]
    assert naive_transform().transforms[1].size == (256, 256)
    assert naive_transform().transforms[2].ratio == 0.25


def test_each_stage_shape_dtype_range() -> None:
    np.random.seed(1)
    torch.manual_seed(1)
    img = Image.fromarray(np.random.randint(0, 256, size=(1024, 1024, 3), dtype=np.uint8))
    steps = naive_transform().transforms
    x = steps[0](img)
    assert x.shape == (3, 1024, 1024) and x.dtype == torch.uint8
    x = steps[1](x)
    assert x.shape == (3, 256, 256) and x.dtype == torch.uint8
    x = steps[2](x)
    assert x.shape == (3, 256, 256) and x.dtype == torch.uint8
    x = steps[3](x)
    assert x.shape == (3, 256, 256) and x.dtype == torch.float32
    assert x[0].min() >= -1e-3 and x[0].max() <= 255 + 1e-3  # Y
    assert x[1:].min() >= -1e-3 and x[1:].max() <= 255 + 1e-3  # Cb, Cr
    x = steps[4](x)
    assert x.dtype == torch.float32 and x.min() >= -1e-5 and x.max() <= 1 + 1e-5


def test_random_mask_fraction_matches_dilated_bernoulli() -> None:
    np.random.seed(2)
    img = torch.full((3, 256, 256), 200, dtype=torch.uint8)
    out = RandomMask(0.25)(img)
    assert out is img  # in place, as in the article
    interior = (out[:, 1:-1, 1:-1] == 0).all(dim=0).float().mean().item()
    expected = 1 - 0.75**5  # a pixel survives only if it and its 4 neighbours were all left unmasked
    assert expected == pytest.approx(0.763, abs=1e-3)
    assert interior == pytest.approx(expected, abs=0.01)
    assert torch.equal(out[0] == 0, out[1] == 0) and torch.equal(out[0] == 0, out[2] == 0)


def test_random_mask_dilation_equals_brute_force() -> None:
    rng = np.random.default_rng(3)
    mask = rng.uniform(size=(40, 37)) < 0.1
    assert np.array_equal(RandomMask().dilate_mask(mask), brute_force_dilation(mask))


def test_convert_color_known_pixels() -> None:
    pixels = torch.tensor([[255, 0, 0, 128], [255, 0, 0, 128], [255, 0, 255, 128]], dtype=torch.uint8).view(3, 1, 4)
    out = ConvertColor()(pixels)
    assert torch.allclose(out[:, 0, 0], torch.tensor([255.0, 128.0, 128.0]), atol=1e-3)  # white
    assert torch.allclose(out[:, 0, 1], torch.tensor([0.0, 128.0, 128.0]), atol=1e-3)  # black
    assert torch.allclose(out[:, 0, 2], torch.tensor([0.114 * 255, 128 + 0.5 * 255, 128 - 0.08131 * 255]), atol=1e-3)  # blue
    assert torch.allclose(out[:, 0, 3], torch.tensor([128.0, 128.0, 128.0]), atol=1e-2)  # grey


def test_scale() -> None:
    x = torch.tensor([0, 51, 255], dtype=torch.uint8)
    assert torch.allclose(Scale()(x), torch.tensor([0.0, 0.2, 1.0]))


def test_dataset_with_transform_gives_article_sample() -> None:
    dataset = FakeDataset(naive_transform(32), length=2, raw_size=(64, 64))
    img, label = dataset[0]
    assert img.shape == (3, 32, 32) and img.dtype == torch.float32 and 0 <= label < 10
