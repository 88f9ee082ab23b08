"""The remedy for one slow transform, chosen from what the catalog says it is.

Every branch reads :class:`~fastpipe.diagnosis.discovery._catalog.TransformFacts`: a crop is decoded crop-only, a float
conversion becomes uint8 out and Normalize after the workers, a flip or PIL conversion that fastpipe's decoder takes
over gets the drop-in, fastpipe's own parts get more CPU, a class with a compiled drop-in gets it, another library's
transform gets the remedy its facts allow (:func:`fastpipe.diagnosis.verdict._fits.library_transform`), and the
user's own code gets "compile it or move it to the device". A user's class called ``ToTensor`` is their own code,
and a renamed subclass of torchvision's crop is torchvision's crop: the name only finds the stage and is printed.
"""

from __future__ import annotations

from fastpipe.diagnosis.discovery._catalog import CUSTOM, FASTPIPE, FLOAT, UINT8, TransformFacts, facts_for
from fastpipe.diagnosis.verdict import _fits
from fastpipe.diagnosis.verdict._loader import LoaderFacts
from fastpipe.diagnosis.verdict._remedies._base import Advice
from fastpipe.diagnosis.verdict._remedies._batches import THREAD_LOADER, normalize_where, thread_loader_fits
from fastpipe.diagnosis.verdict._remedies._decode import decode_box
from fastpipe.diagnosis.verdict._remedies._pipeline import base_name, facts_of, find, label, leaves, mean_std, out_size
from fastpipe.diagnosis.verdict._remedies._probes import with_prepare
from fastpipe.diagnosis.verdict._remedies._snippets import (
    DEVICE_SNIPPET,
    MASK_SNIPPET,
    TUNE_SNIPPET,
    UINT8_SNIPPET,
    decode_crop,
    fmt,
    head,
    snake,
)

#: fastpipe's compiled drop-ins (a catalog entry's ``drop_in``): what the slow original is, and the snippet using it.
_DROP_INS = {
    "fastpipe.transforms.RandomMask": (
        "a per-pixel loop in Python. fastpipe.transforms.RandomMask is a compiled drop-in (Numba or a C++ op, same "
        "distribution and in-place contract); apply it to uint8, before converting to float.",
        MASK_SNIPPET,
    ),
}


def transform(
    name: str, pipeline: object | None, dataset: object | None, image_size: tuple[int, int] | None, loader: LoaderFacts | None = None
) -> Advice:
    """The remedy for the stage a report calls ``name`` in ``pipeline`` (the dataset's transform), from its facts.

    A stage the pipeline does not hold (or a pipeline fastpipe did not see) is known by its name alone: the catalog's
    entry of that name, or the user's own code when it has none.
    """
    loader = loader or LoaderFacts()
    stage, before = find(pipeline, name)
    name = base_name(name)
    facts = facts_of(stage, name)
    if facts is None:
        return _custom(name, None, loader)
    # fastpipe's compiled parts; the float conversion its ImageFolder keeps from the user's transform is not one: its
    # remedy is uint8 out and Normalize on the device, as for torchvision's
    if facts.library == FASTPIPE and facts.converts is None:
        return with_prepare(_fastpipe_part(name, dataset), dataset)
    library = facts.library_native
    if facts.crop is not None:
        converted = next((label(leaf) for leaf in before if facts_for(leaf).to_tensor), None)
        return decode_box(facts.crop, name, stage, pipeline, dataset, image_size, converted, name, loader.copies)
    if facts.converts == FLOAT:
        return _float_out(name, stage, pipeline, loader)
    if library and facts.decoder_fuses and _decoder_takes(name, stage, pipeline, dataset):
        return _decoder_drop_in(name, facts, pipeline, dataset, loader)
    if facts.drop_in in _DROP_INS:
        what, snippet = _DROP_INS[facts.drop_in]
        return Advice(summary=f"{name}: {what}", snippet=snippet.format(out=out_size(pipeline)))
    if library:
        summary, on_device = _fits.library_transform(name, facts, _fits.crop_before(stage, pipeline), copies=loader.copies)
        return Advice(summary=summary, snippet=DEVICE_SNIPPET.format(name=name, var=snake(name)) if on_device else TUNE_SNIPPET)
    return _custom(name, facts, loader)


def _decoder_takes(name: str, stage: object | None, pipeline: object | None, dataset: object | None) -> bool:
    """Whether fastpipe's ImageFolder would take this stage over (its fast path absorbs it where it stands). A stage
    known by name alone is assumed to stand where the decoder takes it (the usual recipe); a generated raw load has
    no file to decode."""
    if stage is None:
        return True
    if _fits.generated_raw_load(dataset) is not None:
        return False
    fast = _fits.fast_path(pipeline, dataset)
    return fast.active and name in fast.absorbed  # absorb names what it took over: the stage's identity


def _decoder_drop_in(name: str, facts: TransformFacts, pipeline: object | None, dataset: object | None, loader: LoaderFacts) -> Advice:
    """A horizontal flip or a PIL conversion that fastpipe's decoder does while decoding the crop."""
    argument = _fits.transform_argument(dataset)
    snippet = _fits.snippet_for(decode_crop(pipeline, loader.copies), dataset)
    if facts.role == "flip":
        return Advice(
            summary=(
                f"{name}: a copy of every pixel. fastpipe's decode-the-crop drop-ins flip while they resize, "
                f"at no extra cost: fastpipe.datasets.ImageFolder(root, transform={argument}) takes a flip right "
                f"after the crop over (or ImageFolder(root, size={out_size(pipeline)}, hflip=0.5) for uint8 out)."
            ),
            snippet=snippet,
        )
    return Advice(
        summary=(
            f"{name}: it copies every pixel it is given; crop before it, or let the decoder return the "
            f"cropped uint8 tensor itself: fastpipe.datasets.ImageFolder(root, transform={argument}) drops a "
            f"{name} that follows the crop (or ImageFolder(root, size={out_size(pipeline)}))."
        ),
        snippet=snippet,
    )


def _custom(name: str, facts: TransformFacts | None, loader: LoaderFacts) -> Advice:
    """The user's own code (or a library container holding it): compile it, vectorize it, or move it to the device."""
    inside = (
        f" ({facts.library}'s {facts.name}, holding your own code)" if facts is not None and facts.library not in (CUSTOM, FASTPIPE) else ""
    )
    if not loader.copies:  # a CPU step: no device to move it to, only the step's own cores
        return Advice(
            summary=(
                f"{name}: a custom transform that is slow by itself{inside}. Compile it (Numba @njit over a uint8 array, "
                "or a C++ TORCH_LIBRARY op, as fastpipe.transforms.RandomMask is), or vectorize it."
            )
        )
    return Advice(
        summary=(
            f"{name}: a custom transform that is slow by itself{inside}. Compile it (Numba @njit over a uint8 array, or a C++ "
            "TORCH_LIBRARY op, as fastpipe.transforms.RandomMask is), or move it onto the device after the copy, "
            "on whole batches (fastpipe.DevicePrefetcher(transform=...) or Workload(device_transform=...)) if it can: "
            "only if it takes the batch tensor (not PIL images) and, if it is random, draws its parameters per sample "
            "(fastpipe does not know either for your own code)."
        ),
        snippet=DEVICE_SNIPPET.format(name=name, var=snake(name)),
    )


def _fastpipe_part(name: str, dataset: object | None = None) -> Advice:
    """One of fastpipe's own compiled parts (DecodeCrop, JpegRandomResizedCrop, ...): compiling it again cannot help."""
    summary = (
        f"{name}: fastpipe's own part, already native code, so rewriting it will not help. Give it more CPU: "
        "more workers where cores are idle (`fastpipe tune SPEC`, or fastpipe.tune, finds the fewest that keep up and "
        "watches shared memory), or take its work off the CPU: decode on the device (fastpipe.datasets.EncodedImageFolder "
        "with DecodeCropOnDevice, as the jpeg:device workload does) where a GPU decoder is available."
    )
    if thread_loader_fits(dataset):
        summary += f" Or spend less CPU around it: {THREAD_LOADER}."
    return Advice(summary=summary, snippet=TUNE_SNIPPET)


def _float_out(name: str, stage: object | None, pipeline: object | None, loader: LoaderFacts) -> Advice:
    """A float conversion or Normalize in the workers: ship uint8 and normalize after the workers, named by the
    pipeline's own conversions (a preset that converts with ConvertImageDtype is never told about ToTensor)."""
    stages = leaves(pipeline)
    first = next((i for i, leaf in enumerate(stages) if facts_for(leaf).floats), None)
    floated = [label(leaf) for leaf in stages if facts_for(leaf).floats] or [name]
    kept = None if first is None else next((label(leaf) for leaf in stages[:first] if facts_for(leaf).converts == UINT8), None)
    ship = f"your {kept}'s uint8, before {floated[0]}" if kept else "PILToTensor"
    mean, std = mean_std(pipeline)
    where = normalize_where(loader)
    if loader.copies:
        loop = (
            "# your loop: images = normalize(images.to(device, non_blocking=True)); or let fastpipe copy and normalize:\n"
            "# fastpipe.DevicePrefetcher(loader, device, transform=normalize), or fastpipe.Workload(..., device_transform=normalize)\n"
        )
        why = "float32 batches 4x the bytes of uint8"
    else:
        loop = "# your loop: images = normalize(images), on the whole batch (on a CPU step it shares the step's cores)\n"
        why = "float32 batches 4x the bytes of uint8 through shared memory (on a CPU step the arithmetic then shares its cores)"
    return Advice(
        summary=(
            f"{name}: per-pixel float arithmetic in the workers, and {why}. Ship uint8 ({ship}) and normalize {where}: "
            f"fastpipe.transforms.Normalize, which matches your {' + '.join(floated)}."
        ),
        snippet=UINT8_SNIPPET.format(head=head(pipeline, stage), mean=fmt(mean), std=fmt(std), fused=" + ".join(floated), loop=loop),
    )
