"""The transform catalog (issue 30, item 1): each entry is a real class, and its facts are what the class does."""

from __future__ import annotations

import importlib.util
import math
import random

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image

from fastpipe.diagnosis.discovery._catalog import (
    CATALOG,
    CUSTOM,
    FLOAT,
    FLOAT_UNSCALED,
    NO,
    PER_SAMPLE,
    PER_SAMPLE_ONLY,
    PIL,
    TIMM,
    TV1,
    TV2,
    UINT8,
    YES,
    facts_for,
    facts_named,
)


def _resolve(path: str) -> object:
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("library", [TV1, TV2, TIMM])
def test_every_entry_names_a_real_class_and_no_library_transform_is_to_be_compiled(library: str) -> None:
    if library == TIMM:
        pytest.importorskip("timm")
    entries = [e for e in CATALOG if e.library == library]
    assert len(entries) >= 14
    for entry in entries:
        cls = _resolve(entry.qualname)
        assert isinstance(cls, type), entry.qualname
        assert facts_for(cls).qualname == entry.qualname  # the lookup finds each class, v1 and v2 apart
        assert not entry.compile_helps and entry.random in (PER_SAMPLE, "none") and entry.on_device in (YES, PER_SAMPLE_ONLY, NO)


def test_torchvision_facts_per_class() -> None:
    for module, library in ((T, TV1), (v2, TV2)):
        rrc = facts_for(module.RandomResizedCrop(32))
        assert rrc.library == library and rrc.crop is not None and rrc.crop.kind == "random resized" and rrc.crop.rng == "torch"
        assert rrc.random == PER_SAMPLE and rrc.on_device == NO
        assert facts_for(module.ColorJitter(0.4, 0.4, 0.4)).on_device == PER_SAMPLE_ONLY
        assert facts_for(module.RandomHorizontalFlip()).on_device == PER_SAMPLE_ONLY
        assert facts_for(module.RandAugment()).random == PER_SAMPLE
        assert facts_for(module.Normalize((0.5,), (0.5,))).on_device == YES
        assert facts_for(module.PILToTensor()).takes == (PIL,) and facts_for(module.PILToTensor()).on_device == NO
        assert facts_for(module.Resize(8)).crop.kind == "resize" and facts_for(module.CenterCrop(8)).crop.kind == "center"
    assert facts_for(v2.ToDtype(torch.float32, scale=True)).on_device == YES
    assert facts_for(v2.ToImage()).on_device == NO


def test_timm_facts_per_class() -> None:
    timm_transforms = pytest.importorskip("timm.data.transforms")
    from timm.data.auto_augment import rand_augment_transform
    from timm.data.random_erasing import RandomErasing

    rrc = facts_for(timm_transforms.RandomResizedCropAndInterpolation(32))
    assert rrc.library == TIMM and rrc.crop.kind == "random resized" and rrc.crop.rng == "python random" and not rrc.compile_helps
    maybe = facts_for(timm_transforms.MaybePILToTensor())
    assert maybe.library == TIMM and maybe.on_device == NO  # a subclass of nothing, takes PIL: no on-device snippet
    assert facts_for(timm_transforms.MaybeToTensor()).library == TIMM  # not its torchvision parent ToTensor
    rand = facts_for(rand_augment_transform("rand-m9-mstd0.5", {}))
    assert rand.qualname == "timm.data.auto_augment.RandAugment" and rand.takes == (PIL,) and rand.random == PER_SAMPLE
    erase = facts_for(RandomErasing(0.5, device="cpu"))
    assert erase.on_device == YES and erase.random == PER_SAMPLE


def test_timm_random_erasing_really_draws_per_sample_on_a_batch() -> None:
    """The catalog says timm's RandomErasing can run on whole batches: its batch call erases each sample on its own."""
    RandomErasing = pytest.importorskip("timm.data.random_erasing").RandomErasing
    torch.manual_seed(0)
    random.seed(0)
    batch = torch.ones(16, 3, 32, 32)
    RandomErasing(1.0, mode="const", device="cpu")(batch)
    masks = [(batch[i] == 0).all(0) for i in range(16)]
    assert all(m.any() for m in masks) and len({m.numpy().tobytes() for m in masks}) > 1


def test_torchvision_draws_one_parameter_set_for_a_whole_batch() -> None:
    """Why a per-sample random transform is 'per-sample parameters only': v2's ColorJitter on a batch jitters all alike."""
    torch.manual_seed(0)
    batch = torch.rand(1, 3, 8, 8).expand(8, 3, 8, 8).clone()
    out = v2.ColorJitter(brightness=0.8)(batch)
    assert all(torch.equal(out[0], out[i]) for i in range(8))
    per_sample = torch.stack([v2.ColorJitter(brightness=0.8)(batch[i]) for i in range(8)])
    assert not all(torch.equal(per_sample[0], per_sample[i]) for i in range(8))


def test_timm_random_resized_crop_draws_torchvisions_box_distribution() -> None:
    """The catalog's claim that timm's crop has torchvision's box distribution (only the generator differs)."""
    timm_transforms = pytest.importorskip("timm.data.transforms")
    from scipy.stats import ks_2samp

    image = Image.new("RGB", (500, 375))
    random.seed(0)
    torch.manual_seed(0)
    theirs = [timm_transforms.RandomResizedCropAndInterpolation.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(3000)]
    ours = [T.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(3000)]
    for feature in (lambda b: b[2] * b[3], lambda b: math.log(b[3] / b[2]), lambda b: b[0] + b[2] / 2):
        assert ks_2samp([feature(b) for b in theirs], [feature(b) for b in ours]).pvalue > 1e-3


class _Tweaked(T.RandomResizedCrop):
    """A user's subclass that only changes defaults: still torchvision's crop."""

    def __init__(self) -> None:
        super().__init__(32, scale=(0.5, 1.0))


class _Rewritten(T.ColorJitter):
    """A user's subclass that replaces the work: the user's own code."""

    def forward(self, img):  # type: ignore[no-untyped-def]
        return img


def test_subclasses_walk_the_mro_unless_they_override_the_work() -> None:
    tweaked = facts_for(_Tweaked())
    assert tweaked.library == TV1 and tweaked.subclass == "_Tweaked" and tweaked.crop is not None
    rewritten = facts_for(_Rewritten())
    assert rewritten.custom and rewritten.compile_helps and "ColorJitter" in rewritten.on_device_why


def test_unknown_classes_lambdas_and_containers() -> None:
    class Mine:
        def __call__(self, x):  # type: ignore[no-untyped-def]
            return x

    assert facts_for(Mine()).library == CUSTOM and facts_for(Mine()).compile_helps
    assert facts_for(T.Lambda(lambda x: x)).custom
    assert facts_for(lambda x: x).custom
    library_only = facts_for(T.RandomApply([T.ColorJitter(0.4)], p=0.8))
    assert library_only.library == TV1 and not library_only.compile_helps and library_only.on_device == PER_SAMPLE_ONLY
    holding_mine = facts_for(T.RandomApply([Mine()], p=0.8))
    assert holding_mine.compile_helps and holding_mine.on_device == NO
    from fastpipe.transforms import RandomMask

    assert facts_for(RandomMask()).library == "fastpipe" and not facts_for(RandomMask()).compile_helps
    from fastpipe.workloads.toy.naive import RandomMask as NaiveMask

    assert facts_for(NaiveMask()).custom  # the toy's naive stage is deliberately user code


# ----- the facts the advice decides by (issue 40, item 4): each checked against what the class does ---------------------
def _photo() -> Image.Image:
    return Image.fromarray(torch.randint(0, 256, (40, 60, 3), dtype=torch.uint8).numpy())


@pytest.mark.filterwarnings("ignore:The transform `ToTensor\\(\\)` is deprecated")
def test_converts_is_the_dtype_each_conversion_hands_out() -> None:
    """UINT8, FLOAT (values in [0, 1] or normalized) and FLOAT_UNSCALED (0..255 as floats), from running each class."""
    image = _photo()
    cases = [
        (T.ToTensor(), image),
        (T.PILToTensor(), image),
        (T.ConvertImageDtype(torch.float32), T.PILToTensor()(image)),
        (T.Normalize((0.5,) * 3, (0.5,) * 3), T.ToTensor()(image)),
        (v2.ToImage(), image),
        (v2.ToDtype(torch.float32, scale=True), v2.ToImage()(image)),
        (v2.ToTensor(), image),
        (v2.PILToTensor(), image),
    ]
    if importlib.util.find_spec("timm") is not None:  # timm is optional
        import timm.data.transforms as timm_transforms

        cases += [(timm_transforms.ToTensor(), image), (timm_transforms.MaybeToTensor(), image)]
        cases += [(timm_transforms.MaybePILToTensor(), image), (timm_transforms.ToNumpy(), image)]
    from fastpipe.datasets.absorb import ToTensor as KeptToTensor

    cases.append((KeptToTensor(), T.PILToTensor()(image)))
    for transform, given in cases:
        out = torch.as_tensor(transform(given))
        facts = facts_for(transform)
        expected = UINT8 if out.dtype == torch.uint8 else FLOAT_UNSCALED if out.max() > 1.5 and out.min() >= 0 else FLOAT
        assert facts.converts == expected, (type(transform).__module__, type(transform).__name__, out.dtype)
    for transform in (T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ColorJitter(0.4), v2.RandomErasing()):
        assert facts_for(transform).converts is None  # keeps whatever dtype it is given


def test_decoder_fuses_is_what_fastpipes_decoder_takes_over() -> None:
    """The fact the advice reads (``decoder_fuses``) against fastpipe.datasets.absorb itself: a crop at the start, a
    flip or a conversion right after a RandomResizedCrop."""
    from fastpipe.datasets import absorb

    crops = [T.RandomResizedCrop(32), T.Resize(32), T.CenterCrop(32), T.RandomCrop(32), v2.RandomResizedCrop(32), v2.RandomCrop(32)]
    after = [T.RandomHorizontalFlip(), T.RandomVerticalFlip(), T.ToTensor(), T.PILToTensor(), v2.PILToTensor(), v2.ToImage()]
    after += [T.ColorJitter(0.4), T.Grayscale()]
    for transform in crops:
        taken = absorb([transform]).absorbed == (type(transform).__name__,)
        assert facts_for(transform).decoder_fuses == taken, transform
    for transform in after:
        taken = type(transform).__name__ in absorb([T.RandomResizedCrop(32), transform]).absorbed
        assert facts_for(transform).decoder_fuses == taken, transform


def test_to_tensor_marks_the_conversions_from_a_pil_image() -> None:
    image = _photo()
    for transform in (T.ToTensor(), T.PILToTensor(), v2.ToImage(), v2.PILToTensor()):
        assert isinstance(transform(image), torch.Tensor) and facts_for(transform).to_tensor, transform
    for transform in (T.Normalize((0.5,), (0.5,)), T.ConvertImageDtype(torch.float32), v2.ToDtype(torch.float32), T.RandomCrop(8)):
        assert not facts_for(transform).to_tensor, transform


def test_facts_named_is_the_catalogs_entry_of_that_name() -> None:
    assert facts_named("ToTensor").qualname == "torchvision.transforms.ToTensor"  # v1 first
    assert facts_named("RandomResizedCrop").crop.kind == "random resized"
    assert facts_named("RandomMask").drop_in == "fastpipe.transforms.RandomMask"  # the toy's naive mask
    assert facts_named("MyOwnTransform") is None
