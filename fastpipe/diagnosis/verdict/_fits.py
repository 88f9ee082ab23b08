"""Which fixes fit a stage, from what the catalog knows it is (:mod:`fastpipe.diagnosis.discovery._catalog`).

The remedies of :mod:`fastpipe.diagnosis.verdict._advice` are worded per stage; these functions hold the rules that
keep them true to the stage, each from one catalog fact:

* a library transform is already native code: never "compile it";
* a per-sample random transform cannot move onto the device on whole batches as it is (torchvision called on a
  batch draws one parameter set for all of it): only through a kernel that draws per sample;
* a transform that takes PIL images cannot run after the copy: no on-device snippet;
* fastpipe's ImageFolder is recommended only where :func:`fastpipe.datasets.absorb` takes the crop over (its
  ``fast_path``), and otherwise the report says why not, in its own words;
* a dataset whose raw load generates its images (the toy's) decodes no file, so no decode drop-in applies.
"""

from __future__ import annotations

from typing import Any

from fastpipe.diagnosis.discovery._catalog import PER_SAMPLE, PER_SAMPLE_ONLY, PIL, TENSOR, TIMM, YES, TransformFacts, facts_for
from fastpipe.diagnosis.discovery._holder import delegated_attribute, open_holder
from fastpipe.stages import split_transform

TUNE = "give it more CPU: more workers where cores are idle (`fastpipe tune SPEC`, or fastpipe.tune, finds the fewest that keep up)"


def leaves(transform: object | None) -> list[object]:
    """The stages of a Compose, a list of stages, a preset class holding a Compose, or one stage, flattened as a
    diagnosis finds them (conditional containers such as RandomApply stay one stage)."""
    if transform is None:
        return []
    return [stage.transform for stage in split_transform(transform, open_holder)]


def folder(dataset: object | None) -> object | None:
    """The ImageFolder-like dataset under wrappers that keep it as ``.dataset`` (Subset and most user wrappers)."""
    for _ in range(4):
        if getattr(dataset, "samples", None) is not None or getattr(dataset, "dataset", None) is None:
            break
        dataset = getattr(dataset, "dataset")
    return dataset


def generated_raw_load(dataset: object | None) -> str | None:
    """The dataset's class name when its raw load generates images: it declares so (``raw_load_reads_files = False``,
    as the toy's FakeDataset does), or it is torchvision's FakeData (random PIL images, made in code). No file is read
    or decoded, so no decode drop-in applies and no image size is to be read. Else None."""
    from torchvision.datasets import FakeData

    inner = folder(dataset)
    if inner is not None and (getattr(type(inner), "raw_load_reads_files", True) is False or isinstance(inner, FakeData)):
        return type(inner).__name__
    return None


def fast_path(transform: object | None, dataset: object | None) -> Any:
    """What fastpipe's ImageFolder would take over from these stages (its own ``fast_path``), with the dataset's loader."""
    from torchvision.datasets.folder import default_loader

    from fastpipe.datasets import absorb

    inner = folder(dataset)
    own = getattr(inner, "fast_path", None)
    if own is not None and type(inner).__module__.startswith("fastpipe.datasets"):
        return own
    loader = getattr(inner, "loader", default_loader)
    return absorb(leaves(transform), loader_is_default=loader is default_loader)


def holder_attribute(dataset: object | None) -> str | None:
    """The attribute of the dataset's transform that holds its chain, when that transform is a preset class (its
    ``__call__`` only calls it); None for a plain Compose. fastpipe's ImageFolder needs the chain itself."""
    held = getattr(folder(dataset), "transform", None)
    return delegated_attribute(held) if held is not None and open_holder(held) is not None else None


def transform_argument(dataset: object | None) -> str:
    """How to pass the user's transform to the drop-in: the transform itself, or the chain a preset class holds."""
    attr = holder_attribute(dataset)
    if attr is None:
        return "the_same_transform"
    return f"preset.{attr} (the chain your {type(getattr(folder(dataset), 'transform')).__name__} holds and calls)"


def snippet_for(snippet: str, dataset: object | None) -> str:
    """A drop-in snippet passing ``transform.<attr>`` where the dataset's transform is a preset class."""
    attr = holder_attribute(dataset)
    if attr is None:
        return snippet
    return snippet.replace(
        "ImageFolder(root, transform=transform)  #", f"ImageFolder(root, transform=transform.{attr})  # your preset's chain;"
    )


def not_absorbed(crop: str, stage: object | None, why: str | None) -> str:
    """Why fastpipe's ImageFolder would not take ``crop`` over, and what would let it, from the catalog."""
    facts = facts_for(stage) if stage is not None else None
    text = f"fastpipe's ImageFolder would not take {crop} over (its fast_path: not absorbed: {why})"
    if facts is not None and facts.library == TIMM and facts.crop is not None and facts.crop.kind == "random resized":
        mode = getattr(stage, "interpolation", None)
        bilinear = getattr(mode, "value", mode) == "bilinear"
        text += (
            f". timm's {crop} draws torchvision's box distribution with Python's random module; torchvision's "
            "RandomResizedCrop(size, scale, ratio) draws the same distribution from torch's RNG and is absorbed "
            + (
                "(its interpolation, bilinear, is the decoder's)"
                if bilinear
                else "only with bilinear interpolation, which this one does not use: that would change the resampling"
            )
        )
    return text + ". Without the drop-in, " + TUNE + "."


def crop_before(stage: object | None, transform: object | None) -> bool:
    """Whether a crop or resize (by the catalog) runs before ``stage``: then it already works on the crop's pixels."""
    found = leaves(transform)
    index = next((i for i, leaf in enumerate(found) if leaf is stage), len(found))
    return any(facts_for(leaf).crop is not None for leaf in found[:index])


def library_transform(name: str, facts: TransformFacts, cropped: bool, *, copies: bool = True) -> tuple[str, bool]:
    """The remedy for a slow library transform, from its facts: (summary, whether an on-device snippet fits).

    ``cropped``: a crop runs before it, so it already works on the crop's pixels. ``copies``: the device has a copy
    (not ``cpu``); without one there is no device to move it to, and it stays in the workers.
    """
    head = f"{name}: {facts.library}'s {facts.role}, already native code, so compiling or rewriting it will not help."
    if not copies:
        random = " It draws its parameters per sample." if facts.random == PER_SAMPLE else ""
        return (f"{head}{random} On a CPU step there is no device to move it to: it stays in the workers; {TUNE}.", False)
    if facts.on_device == YES and facts.random == PER_SAMPLE:
        after = " It works on normalized pixels, so Normalize moves onto the device before it." if facts.role == "erase" else ""
        return (
            f"{head} It can move onto the device after the copy on whole batches as it is: {facts.on_device_why}.{after} "
            "Or, in the workers, " + TUNE + ".",
            True,
        )
    if facts.on_device == YES:
        return (
            f"{head} It is the same arithmetic on every sample, so it can move onto the device after the copy, on "
            "whole batches (fastpipe.DevicePrefetcher(transform=...) or Workload(device_transform=...)), where it is "
            "a fraction of the step; ship uint8 to the device when it is the float conversion.",
            True,
        )
    if facts.on_device == PER_SAMPLE_ONLY:
        where = (
            ""
            if cropped
            else " It runs before any crop, on the whole image: after the crop it would touch fewer pixels (check the augmentation stays the same)."
        )
        return (
            f"{head} It cannot move onto the device on whole batches as it is: {facts.on_device_why}, a different "
            "augmentation; on the device it needs a kernel that draws per sample (kornia.augmentation's, "
            f"same_on_batch=False), a different implementation to check with `fastpipe compare`. In the workers, {TUNE}.{where}",
            False,
        )
    pil = " It takes PIL images, so it cannot run after the copy." if PIL in facts.takes and TENSOR not in facts.takes else ""
    random = " It draws its parameters per sample." if facts.random == PER_SAMPLE else ""
    return (f"{head}{pil}{random} It stays in the workers: {TUNE}.", False)
