"""fastpipe.datasets.ImageFolder as a drop-in for torchvision's: same contract, and the user's transform absorbed.

The contract checks are fastpipe's own (torchvision's test suite is run against the class apart, outside
the repository); the absorbed pipelines are compared with torchvision's class on the same seed: the same
crop boxes, pixels within the op's tolerance (fastpipe.ops.jpeg's docstring: mean absolute difference
under 2.5 levels when the decoder scales in the DCT, under 0.5 when it does not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

import fastpipe.ops.jpeg as jpeg
from fastpipe.datasets import DatasetFolder, ImageFolder
from fastpipe.datasets.absorb import ToPIL

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: fastpipe.ops.jpeg's documented tolerance against PIL, in 0..255 levels (mean absolute difference, DCT-scaled decode)
TOLERANCE = 2.5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=8, seed=0, classes=2)


def pairs(root: Path, transform, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fastpipe's item, torchvision's item) for every sample, each drawn right after the same torch.manual_seed."""
    ours, theirs = ImageFolder(root, transform=transform), torchvision.datasets.ImageFolder(root, transform=transform)
    out = []
    for i in range(len(ours)):
        torch.manual_seed(seed + i)
        a, label_a = ours[i]
        torch.manual_seed(seed + i)
        b, label_b = theirs[i]
        assert label_a == label_b
        out.append((a, b))
    return out


def levels(a: torch.Tensor, b: torch.Tensor, normalized: bool = False) -> float:
    """Mean absolute difference in 0..255 levels (undoing ToTensor's /255 and Normalize's /std)."""
    diff = (a.float() - b.float()).abs()
    if a.is_floating_point():
        diff = diff * 255 * (torch.tensor(STD)[:, None, None] if normalized else 1)
    return diff.mean().item()


def test_it_is_torchvisions_class_with_torchvisions_signature(corpus: Path) -> None:
    dataset = ImageFolder(corpus, T.ToTensor())  # transform is the second positional argument, as in torchvision
    reference = torchvision.datasets.ImageFolder(corpus, T.ToTensor())
    assert isinstance(dataset, torchvision.datasets.ImageFolder) and isinstance(dataset, torchvision.datasets.VisionDataset)
    assert dataset.samples == reference.samples and dataset.imgs == dataset.samples and dataset.targets == reference.targets
    assert dataset.classes == reference.classes and dataset.class_to_idx == reference.class_to_idx
    assert torch.equal(dataset[3][0], reference[3][0])  # nothing to absorb: PIL decodes, exactly as torchvision
    assert dataset.transforms is not None and not dataset.fast_path.active and "starts with ToTensor" in str(dataset.fast_path)


def test_no_transform_gives_torchvisions_pil_image(corpus: Path) -> None:
    image, label = ImageFolder(corpus)[5]
    expected, expected_label = torchvision.datasets.ImageFolder(corpus)[5]
    assert type(image) is type(expected) and image.mode == "RGB" and label == expected_label
    assert np.array_equal(np.asarray(image), np.asarray(expected))


def test_find_classes_and_make_dataset_overrides_are_honoured(corpus: Path) -> None:
    class OneClass(ImageFolder):
        def find_classes(self, directory):
            return ["class_1"], {"class_1": 0}

    class FirstTwo(ImageFolder):
        @staticmethod
        def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
            return torchvision.datasets.ImageFolder.make_dataset(directory, class_to_idx, extensions, is_valid_file, allow_empty)[:2]

    one = OneClass(corpus, transform=T.Compose([T.RandomResizedCrop(32), T.PILToTensor()]))
    assert one.classes == ["class_1"] and all("class_1" in path for path, _ in one.samples) and one.targets == [0] * len(one)
    assert one[0][0].shape == (3, 32, 32)
    assert len(FirstTwo(corpus)) == 2


def test_dataset_folder_takes_torchvisions_arguments(corpus: Path) -> None:
    from torchvision.datasets.folder import pil_loader

    dataset = DatasetFolder(corpus, pil_loader, extensions=(".jpg",), transform=T.Compose([T.CenterCrop(24), T.PILToTensor()]))
    assert isinstance(dataset, torchvision.datasets.DatasetFolder) and dataset.fast_path.active
    assert dataset[0][0].shape == (3, 24, 24) and dataset[0][0].dtype == torch.uint8


def test_transforms_v2_wrapper_and_a_transform_set_later(corpus: Path) -> None:
    dataset = ImageFolder(corpus)
    wrapped = torchvision.datasets.wrap_dataset_for_transforms_v2(dataset)
    assert wrapped[0][0].size == ImageFolder(corpus)[0][0].size
    dataset.transform = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])  # as torchvision users do
    assert dataset.fast_path.absorbed == ("Resize", "CenterCrop", "PILToTensor") and dataset[0][0].shape == (3, 32, 32)
    assert "Fast path: decoder does Resize + CenterCrop + PILToTensor" in repr(dataset)


@pytest.mark.parametrize(
    "transform, absorbed, rest_on, why",
    [
        (
            T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
            ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor"),
            "tensor",
            None,
        ),
        (
            v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]),
            ("RandomResizedCrop", "RandomHorizontalFlip"),
            "tensor",
            None,
        ),
        (T.Compose([T.RandomResizedCrop(32), T.ColorJitter(0.4), T.ToTensor()]), ("RandomResizedCrop",), "PIL image", "ColorJitter"),
        (T.Compose([T.RandomResizedCrop(32, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor()]), (), "nothing", "bicubic"),
        (v2.Compose([v2.ToImage(), v2.RandomResizedCrop(32)]), (), "nothing", "put ToImage after the crop"),
        (T.Compose([T.RandomHorizontalFlip(), T.RandomResizedCrop(32)]), (), "nothing", "starts with RandomHorizontalFlip"),
    ],
)
def test_fast_path_says_what_was_absorbed_and_why_not_the_rest(corpus: Path, transform, absorbed, rest_on, why) -> None:
    path = ImageFolder(corpus, transform=transform).fast_path
    assert path.absorbed == absorbed and path.rest_on == rest_on
    assert (path.why_not is None) if why is None else (why in path.why_not)


def test_a_custom_loader_is_kept_as_it_is(corpus: Path) -> None:
    dataset = ImageFolder(corpus, transform=T.RandomResizedCrop(16), loader=lambda path: torchvision.datasets.folder.pil_loader(path))
    assert not dataset.fast_path.active and "custom loader" in dataset.fast_path.why_not and dataset[0][0].size == (16, 16)


def _record_v1_boxes(monkeypatch: pytest.MonkeyPatch, boxes: list) -> None:
    """Record the boxes v1's RandomResizedCrop crops, where it calls resized_crop."""
    real = torchvision.transforms.transforms.F.resized_crop

    def record(img, top, left, height, width, *args, **kwargs):
        boxes.append((top, left, height, width))
        return real(img, top, left, height, width, *args, **kwargs)

    monkeypatch.setattr(torchvision.transforms.transforms.F, "resized_crop", record)


def _record_v2_boxes(monkeypatch: pytest.MonkeyPatch, boxes: list) -> None:
    """Record the boxes v2's RandomResizedCrop draws (its make_params, which feeds its resized_crop kernel)."""
    real = v2.RandomResizedCrop.make_params

    def record(self, flat_inputs):
        params = real(self, flat_inputs)
        boxes.append((params["top"], params["left"], params["height"], params["width"]))
        return params

    monkeypatch.setattr(v2.RandomResizedCrop, "make_params", record)


@requires_op
@pytest.mark.parametrize(
    "recipe, record",
    [
        (T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]), _record_v1_boxes),
        (
            v2.Compose(
                [
                    v2.RandomResizedCrop(48),
                    v2.RandomHorizontalFlip(),
                    v2.ToImage(),
                    v2.ToDtype(torch.float32, scale=True),
                    v2.Normalize(MEAN, STD),
                ]
            ),
            _record_v2_boxes,
        ),
    ],
    ids=["v1", "v2"],
)
def test_training_recipe_draws_torchvisions_boxes(corpus: Path, monkeypatch: pytest.MonkeyPatch, recipe, record) -> None:
    """Same seed, same RandomResizedCrop boxes (recorded where torchvision draws them and where the op decodes), same pixels."""
    import fastpipe.datasets.crop as crop_module

    theirs, ours = [], []
    real_decode = crop_module.jpeg_ops.decode_jpeg_crop

    def record_ours(source, box, size, hflip=False):
        ours.append(tuple(box))
        return real_decode(source, box, size, hflip=hflip)

    record(monkeypatch, theirs)
    monkeypatch.setattr(crop_module.jpeg_ops, "decode_jpeg_crop", record_ours)
    assert ImageFolder(corpus, transform=recipe).fast_path.absorbed[:2] == ("RandomResizedCrop", "RandomHorizontalFlip")
    for a, b in pairs(corpus, recipe, seed=100):
        assert a.shape == b.shape == (3, 48, 48) and a.dtype == b.dtype == torch.float32
        assert levels(a, b, normalized=True) < TOLERANCE  # a flip drawn differently would be tens of levels off
    assert len(ours) == len(theirs) == 8 and ours == theirs


@requires_op
@pytest.mark.parametrize(
    "recipe",
    [
        T.Compose([T.Resize(64), T.CenterCrop(56), T.ToTensor(), T.Normalize(MEAN, STD)]),
        v2.Compose([v2.Resize(64), v2.CenterCrop(56), v2.PILToTensor()]),
        T.Compose([T.Resize((40, 50)), T.PILToTensor()]),
        T.Compose([T.Resize(30, max_size=36), T.PILToTensor()]),
        T.Compose([T.CenterCrop(100), T.RandomHorizontalFlip(1.0), T.PILToTensor()]),
        T.Compose([T.Resize(20), T.CenterCrop(32), T.PILToTensor()]),  # larger than the image: padded, as torchvision does
        v2.Compose([v2.Resize(size=None, max_size=40), v2.PILToTensor()]),
        v2.Compose([v2.Resize(size=None, max_size=60), v2.CenterCrop(36), v2.PILToTensor()]),
        T.Compose([T.Resize(30, max_size=44), T.CenterCrop(28), T.PILToTensor()]),
        T.Compose([T.CenterCrop(48), T.RandomHorizontalFlip(0.0), T.RandomHorizontalFlip(), T.PILToTensor()]),  # p=0 draws too
    ],
    ids=[
        "resize-center-v1",
        "resize-center-v2",
        "resize-hw",
        "max-size",
        "center-flip",
        "padded",
        "max-size-only",
        "max-size-center",
        "resize-max-size-center",
        "flip-p0",
    ],
)
def test_validation_recipes_match_torchvision(corpus: Path, recipe) -> None:
    assert ImageFolder(corpus, transform=recipe).fast_path.active
    for a, b in pairs(corpus, recipe):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert levels(a, b, normalized=a.is_floating_point()) < TOLERANCE


@requires_op
def test_what_follows_a_crop_on_pil_runs_unchanged_on_the_crop(corpus: Path) -> None:
    recipe = T.Compose([T.RandomResizedCrop(40), T.Grayscale(3), T.PILToTensor()])
    assert isinstance(ImageFolder(corpus, transform=recipe).fast_path.rest[0], ToPIL)
    for a, b in pairs(corpus, recipe, seed=7):
        assert a.shape == b.shape == (3, 40, 40) and levels(a, b) < TOLERANCE


@requires_op
def test_a_transform_that_ends_with_the_crop_gives_a_pil_image(corpus: Path) -> None:
    image, _ = ImageFolder(corpus, transform=T.RandomResizedCrop(24))[0]
    assert image.size == (24, 24) and image.mode == "RGB"
    assert "returns the crop as a PIL image" in str(ImageFolder(corpus, transform=T.RandomResizedCrop(24)).fast_path)


#: (height, width) of the synthetic images: portrait, landscape, odd and prime sides, one smaller than some crops
ODD_SIZES = ((301, 199), (199, 301), (257, 255), (97, 131))


@pytest.fixture(scope="module")
def odd_images(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two photos of the corpus (one landscape, one portrait), and textured synthetic JPEGs of odd sizes.

    The synthetic texture is random blobs about 12 pixels across: the op's tolerance is documented on
    photographs, and blobs of 6 pixels, sharper than photos, measured up to 3.5 levels off after a 4x shrink
    with the region exactly aligned (the DCT shrink is sharper than PIL's filter); the region itself is checked
    apart, by :func:`best_shift`.
    """
    import shutil

    from PIL import Image

    root = tmp_path_factory.mktemp("odd")
    (root / "photos").mkdir()
    (root / "synthetic").mkdir()
    photos = sorted(corpus.rglob("*.jpg"))
    landscape = next(path for path in photos if Image.open(path).width > Image.open(path).height)
    portrait = next(path for path in photos if Image.open(path).width < Image.open(path).height)
    for path in (landscape, portrait):
        shutil.copy(path, root / "photos" / path.name)
    generator = torch.Generator().manual_seed(3)
    for height, width in ODD_SIZES:
        coarse = torch.rand(1, 3, height // 12 + 2, width // 12 + 2, generator=generator)
        pixels = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=False)
        array = (pixels[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        Image.fromarray(array).save(root / "synthetic" / f"{height}x{width}.jpg", quality=95)
    return root


def best_shift(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """The (dy, dx) in -1..1 that brings ``a`` closest to ``b``: (0, 0) when they show the same region."""
    h, w = a.shape[-2:]
    distance = {}
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            ours = a[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)]
            theirs = b[:, max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)]
            distance[(dy, dx)] = levels(ours, theirs)
    return min(distance, key=distance.__getitem__)


@requires_op
@pytest.mark.parametrize(
    "recipe",
    [
        T.Compose([T.Resize((40, 50)), T.PILToTensor()]),
        v2.Compose([v2.Resize((61, 37)), v2.CenterCrop(29), v2.PILToTensor()]),
        T.Compose([T.Resize(45), T.PILToTensor()]),  # the shorter side: height of a landscape image, width of a portrait one
        v2.Compose([v2.Resize(45, max_size=60), v2.PILToTensor()]),
        v2.Compose([v2.Resize(size=None, max_size=77), v2.CenterCrop(41), v2.PILToTensor()]),
        T.Compose([T.Resize(64), T.CenterCrop(51), T.PILToTensor()]),
        T.Compose([T.CenterCrop(51), T.PILToTensor()]),
        v2.Compose([v2.CenterCrop((33, 48)), v2.PILToTensor()]),
        T.Compose([T.CenterCrop((311, 517)), T.PILToTensor()]),  # larger than the synthetic images: zero-padded
        T.Compose([T.Resize(40), T.CenterCrop((41, 35)), T.PILToTensor()]),  # a row taller than the resized landscape ones
        T.Compose([T.Resize(280), T.CenterCrop(263), T.PILToTensor()]),  # the synthetic images are enlarged
        T.Compose([T.Resize((131, 97)), T.CenterCrop(51), T.PILToTensor()]),  # the 131x97 image's own size: the box alone
    ],
    ids=[
        "resize-hw",
        "resize-hw-center-odd",
        "resize-short-side",
        "resize-max-size",
        "max-size-center",
        "resize-center-odd",
        "center-odd",
        "center-hw",
        "center-larger",
        "center-larger-one-side",
        "resize-up-center",
        "resize-to-own-size-center",
    ],
)
def test_absorbed_geometry_is_torchvisions_on_odd_sizes(odd_images: Path, recipe) -> None:
    """Every absorbed Resize/CenterCrop form cuts torchvision's region, on portrait, landscape and odd-sized images."""
    assert ImageFolder(odd_images, transform=recipe).fast_path.active
    for a, b in pairs(odd_images, recipe):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8
        assert levels(a, b) < TOLERANCE and best_shift(a, b) == (0, 0)


ADVICE_RECIPES = {
    "max-size-only": v2.Compose(
        [v2.Resize(size=None, max_size=300), v2.CenterCrop(200), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    ),
    "resize-max-size": T.Compose([T.Resize(256, max_size=300), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "resize-hw": T.Compose([T.Resize((240, 320)), T.CenterCrop((199, 211)), T.ToTensor(), T.Normalize(MEAN, STD)]),
    "resize-max-size-flip": T.Compose([T.Resize(256, max_size=300), T.RandomHorizontalFlip(1.0), T.ToTensor()]),
}


@pytest.mark.parametrize(
    "recipe, absorbed",
    [
        *(
            pytest.param(recipe, absorbed, id=f"{name}-{kind}")
            for name, recipe in ADVICE_RECIPES.items()
            for absorbed, kind in ((True, "absorbed"), (False, "torchvisions"))
        ),
        # not absorbed (the decoder resizes bilinearly), so only torchvision's stages: the interpolation is written back too
        pytest.param(
            T.Compose([T.Resize(256, max_size=300, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor()]),
            False,
            id="bicubic-torchvisions",
        ),
    ],
)
def test_advice_writes_the_users_resize_back_exactly(recipe, absorbed: bool) -> None:
    """The uint8 snippet's transform cuts what the user's did (max_size and all), from fastpipe's stages or torchvision's."""
    from PIL import Image

    from fastpipe.datasets import absorb
    from fastpipe.diagnosis.verdict._advice import TRANSFORM, recommend

    path = absorb(recipe)
    assert path.active or not absorbed  # the "absorbed" cases are ones fastpipe's ImageFolder takes over
    stages = [path.decode, *path.rest] if absorbed else list(recipe.transforms)
    last = type(stages[-1]).__name__
    namespace: dict = {}
    exec(compile(recommend(last, TRANSFORM, transform=stages).snippet, "<advice snippet>", "exec"), namespace)
    pixels = torch.randint(0, 256, (600, 800, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)).numpy()
    image = Image.fromarray(pixels)  # landscape, larger than every max_size above, so max_size decides the size
    geometry = [t for t in recipe.transforms if type(t).__name__ in ("Resize", "CenterCrop", "RandomHorizontalFlip")]
    expected = v2.Compose([*geometry, v2.PILToTensor()])(image)
    assert torch.equal(namespace["transform"](image), expected)
