"""What the advice reads from the user's pipeline: its stages, and what each one is, by the catalog's facts alone.

Every question the remedies ask about a transform (is it a crop, a float conversion, the conversion from PIL, the
normalization whose mean and std a snippet repeats) is answered here from
:func:`~fastpipe.diagnosis.discovery._catalog.facts_for`, never from a class name: a user's own ``class ToTensor`` is
custom code, and a renamed subclass of torchvision's crop is still torchvision's crop. Names are used only to find
the stage a report names (the names :func:`fastpipe.stages.split_transform` gives) and to print it.
"""

from __future__ import annotations

import re

from fastpipe.diagnosis.discovery._catalog import FLOAT, UINT8, CropFacts, TransformFacts, facts_for, facts_named
from fastpipe.diagnosis.discovery._holder import open_holder
from fastpipe.diagnosis.verdict import _fits
from fastpipe.stages import split_transform, stage_name

#: torchvision's RandomResizedCrop scale range: on average a box covers (0.08 + 1) / 2 of the image's area.
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_OUT = 224
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def leaves(transform: object | None) -> list[object]:
    """The stages of a Compose, a list of stages, a preset class holding a Compose, or one stage, flattened as a
    diagnosis finds them."""
    return _fits.leaves(transform)


def label(leaf: object) -> str:
    """The name a report gives the stage (its class's, or a function's own): for the user to read, never to decide by."""
    return stage_name(leaf)


def base_name(name: str) -> str:
    """``Normalize#2`` -> ``Normalize``: a repeated stage's name without its count."""
    return re.sub(r"#\d+$", "", name)


def find(transform: object | None, name: str) -> tuple[object | None, list[object]]:
    """The stage a report calls ``name`` (``Normalize``, ``Normalize#2`` for the second one) and the stages before it,
    by the names :func:`~fastpipe.stages.split_transform` gives; (None, []) when the pipeline has no such stage."""
    if transform is None:
        return None, []
    stages = split_transform(transform, open_holder)
    for matches in (lambda s: s.name == name, lambda s: base_name(s.name) == base_name(name)):
        i = next((i for i, stage in enumerate(stages) if matches(stage)), None)
        if i is not None:
            return stages[i].transform, [stage.transform for stage in stages[:i]]
    return None, []


def facts_of(stage: object | None, name: str) -> TransformFacts | None:
    """What the stage is: its own facts (by type), or, for a stage known only by name, the catalog's entry of that name."""
    return facts_for(stage) if stage is not None else facts_named(base_name(name))


def crop_of(transform: object | None) -> tuple[object, CropFacts] | None:
    """The first crop or resize in the pipeline (by the catalog, any library's) and its crop facts: what a decoder
    could do while decoding; None when there is none."""
    for leaf in leaves(transform):
        crop = facts_for(leaf).crop
        if crop is not None:
            return leaf, crop
    return None


def out_size(transform: object | None) -> int:
    """The output size of the first crop that states one (the shorter side of a pair), else 224."""
    for leaf in leaves(transform):
        size = getattr(leaf, "size", None) if facts_for(leaf).crop is not None else None
        if isinstance(size, int):
            return size
        if isinstance(size, (list, tuple)) and size:
            return int(min(size))
    return DEFAULT_OUT


def mean_std(transform: object | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std of the pipeline's normalization, for a snippet that moves it; ImageNet's when it has none."""
    normalize = next((leaf for leaf in leaves(transform) if facts_for(leaf).role == "normalize"), None)
    mean, std = getattr(normalize, "mean", None), getattr(normalize, "std", None)
    if mean is None or std is None:
        return IMAGENET
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def floats(transform: object | None) -> list[object]:
    """The stages that hand out float images (float conversions, Normalize), in order."""
    return [leaf for leaf in leaves(transform) if facts_for(leaf).floats]


def ships_uint8(transform: object | None) -> bool | None:
    """Whether the pipeline found hands out uint8 images: its last conversion keeps uint8 (PILToTensor, timm's
    MaybePILToTensor or ToNumpy, v2's ToImage) with no float conversion after it. None when it has no conversion
    fastpipe knows, or when the user's own code runs after the last one (its dtype is theirs: the toy's ``Scale``
    makes floats of PILToTensor's uint8); then nothing is said either way."""
    kept = None
    for leaf in leaves(transform):
        facts = facts_for(leaf)
        if facts.floats:
            kept = False
        elif facts.converts == UINT8:
            kept = True
        elif facts.compile_helps:  # the user's own code (or a container holding it): what it hands out is unknown
            kept = None
    return kept


def conversion_after(transform: object | None) -> str:
    """`` (and X)`` for the pipeline's conversion to a tensor (X), which a decoder returning uint8 tensors replaces."""
    found = next((label(leaf) for leaf in leaves(transform) if facts_for(leaf).to_tensor), None)
    return f" (and {found})" if found else ""


def replaced(transform: object | None) -> str:
    """What ``ImageFolder(root, size=...)`` replaces, named from the pipeline found: its crop, a horizontal flip and its
    conversions to a float tensor (the usual recipe, said as such, when fastpipe saw no transform)."""
    if transform is None:
        return "RandomResizedCrop + RandomHorizontalFlip + ToTensor (the usual recipe: fastpipe did not see yours)"
    found = crop_of(transform)
    crop_type = type(found[0]) if found is not None else None

    def kept(leaf: object) -> bool:
        facts = facts_for(leaf)
        flip = facts.role == "flip" and facts.decoder_fuses  # the decoder's flip is horizontal only
        dtype = facts.role == "convert" and facts.converts == FLOAT
        return type(leaf) is crop_type or flip or facts.to_tensor or dtype

    return " + ".join(label(leaf) for leaf in leaves(transform) if kept(leaf)) or "crop"
