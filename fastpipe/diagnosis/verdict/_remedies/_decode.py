"""Decode only what the crop keeps: the remedy for a crop or resize, and for the raw load before one.

Which remedy fits depends on the crop's kind (the catalog's :class:`~fastpipe.diagnosis.discovery._catalog.CropFacts`),
never on its class name: a random resized crop is decoded crop-only by fastpipe's ImageFolder (or DecodeCropLoader),
a resize and a centre crop at a DCT scale in one pass, a random or centre crop by a box loader; and none of them
where the raw load decodes no file (the toy's generated images) or DCT scaling cannot pay (images under twice the
output), which the caveat says.
"""

from __future__ import annotations

from fastpipe.diagnosis.discovery._catalog import RRC_TORCH, CropFacts
from fastpipe.diagnosis.verdict import _fits
from fastpipe.diagnosis.verdict._remedies._base import Advice
from fastpipe.diagnosis.verdict._remedies._pipeline import DEFAULT_SCALE, conversion_after, crop_of, label, out_size
from fastpipe.diagnosis.verdict._remedies._probes import typical_size
from fastpipe.diagnosis.verdict._remedies._snippets import BOX_LOADER_SNIPPET, BOXES, TUNE_SNIPPET, VALIDATION_SNIPPET, decode_crop
from fastpipe.diagnosis.verdict._remedies._stream import stream_raw_load

#: The crop kinds that keep the output's size: no DCT scaling, only the box is saved.
_SAME_SIZE = ("random", "center")
#: The crop kinds fastpipe's ImageFolder decodes in one pass at a DCT scale (its validation path).
_ONE_PASS = ("resize", "center")


def crop_caveat(crop: CropFacts, name: str, size: tuple[int, int] | None, out: int) -> str | None:
    """When decoding only the box cannot pay as hoped. DCT scaling (1/2, 1/4, 1/8) needs a box at least twice the output."""
    if crop.kind in _SAME_SIZE:
        if size is None:
            return None
        share = min(1.0, out * out / (size[0] * size[1]))
        return (
            f"{name} keeps the output's size, so there is no DCT scaling; decoding only the box decodes about "
            f"{share:.0%} of each {size[1]}x{size[0]} image"
            + (": little to gain, measure it with `fastpipe compare` first" if share > 0.5 else "")
        )
    if size is None:
        return (
            f"DCT scaling only pays when the crop box is at least twice the output ({2 * out} px for {out}); "
            "fastpipe did not see your image sizes, so check them: on smaller images only the cropping saves time"
        )
    height, width = size
    if min(height, width) >= 2 * out:
        return None
    if crop.kind == "resize":
        return (
            f"on {width}x{height} images to {out} px the drop-in cannot help: the whole image is decoded either way, "
            f"and its short side ({min(height, width)} px) is under twice the output ({2 * out} px), so there is no DCT scaling"
        )
    mean_area = sum(DEFAULT_SCALE) / 2
    return (
        f"on {width}x{height} images to {out} px, DCT scaling cannot help: even the largest crop box "
        f"({min(height, width)} px) is under twice the output ({2 * out} px), so the box is decoded at full "
        f"resolution; decoding only the box still skips the pixels outside it (on average {1 - mean_area:.0%} of the "
        "image with RandomResizedCrop's default scale), so measure it with `fastpipe compare` before relying on it"
    )


def decode_box(
    crop: CropFacts,
    name: str,
    stage: object | None,
    transform: object | None,
    dataset: object | None,
    image_size: tuple[int, int] | None,
    converted: str | None,
    label_: str,
    copies: bool = True,
) -> Advice:
    """Decode only what the crop (``name``, of kind ``crop.kind``) keeps: the remedy for a crop or resize, and for the raw
    load before one (``label_`` heads the summary; ``converted``: the conversion to a tensor that runs before it).

    Only where it applies: a raw load that generates its images decodes no file (:func:`generated`), and fastpipe's
    ImageFolder is named only where its fast path takes the crop over (else the report says why not).
    """
    made = _fits.generated_raw_load(dataset)
    if made is not None:
        return generated(label_, name, made)
    out = out_size(transform if stage is None else stage)
    caveat = crop_caveat(crop, name, typical_size(dataset, image_size), out)
    if converted:
        caveat = f"{name} runs after {converted}, on a tensor of the whole image: move it before the conversion (the drop-in does both)" + (
            "; " + caveat if caveat else ""
        )
    what = "resized" if crop.kind == "resize" else "cropped"
    fast = _fits.fast_path(transform, dataset) if transform is not None else None
    argument = _fits.transform_argument(dataset)
    # absorb reports what it took over by the stages' names: this is the stage's identity, not what it is
    taken = fast is None or (fast.active and name in fast.absorbed)
    if not taken and crop.kind not in BOXES:
        why = fast.why_not if not fast.active else f"it takes over {' + '.join(fast.absorbed)}, not {name}"
        return Advice(
            summary=f"{label_}: the image is decoded whole to be {what} by {name}. {_fits.not_absorbed(name, stage, why)}",
            snippet=TUNE_SNIPPET,
            caveat=caveat,
        )
    if crop.kind in _ONE_PASS and not converted and taken:
        return Advice(
            summary=(
                f"{label_}: the image is decoded whole to be {what} by {name}. Change only the dataset class: "
                f"fastpipe.datasets.ImageFolder(root, transform={argument}) decodes Resize and CenterCrop at the "
                "start of the transform in one pass, at the DCT scale (1/2, 1/4, 1/8) that still covers the resized size."
            ),
            snippet=_fits.snippet_for(VALIDATION_SNIPPET, dataset),
            caveat=caveat,
        )
    if crop.kind in BOXES:
        function, box = BOXES[crop.kind]
        return Advice(
            summary=(
                f"{label_}: the image is decoded whole to be {what} by {name}. {'Scale' if crop.kind == 'resize' else 'Crop'} "
                "while decoding: fastpipe.ops.jpeg.decode_jpeg_crop decodes only the box (at 1/2, 1/4 or 1/8 DCT scale when "
                "the box is at least twice the output), uint8 out, as the loader of torchvision's ImageFolder."
            ),
            snippet=BOX_LOADER_SNIPPET.format(what=function, name=name, out=out, box=box, convert=conversion_after(transform)),
            caveat=caveat,
        )
    return Advice(
        summary=(
            f"{label_}: the image is decoded whole to be {what} by {name}. Decode only the crop, changing only the dataset "
            f"class: fastpipe.datasets.ImageFolder(root, transform={argument}) draws torchvision's box from the "
            f"header and decodes only it (then, for uint8 out, fastpipe.datasets.ImageFolder(root, size={out}); or "
            f"DecodeCropLoader({out}) as the loader of torchvision's ImageFolder)."
        ),
        snippet=_fits.snippet_for(decode_crop(transform, copies), dataset),
        caveat=caveat,
    )


def raw_load(transform: object | None, dataset: object | None, image_size: tuple[int, int] | None, copies: bool = True) -> Advice:
    """The raw load's remedy: the stream's read, or decoding only what the pipeline's first crop keeps."""
    stream = stream_raw_load(dataset)
    if stream is not None:
        return stream
    found = crop_of(transform)
    made = _fits.generated_raw_load(dataset)
    if made is not None:
        return generated("Raw load", None if found is None else label(found[0]), made)
    if found is not None:
        stage, crop = found
        return decode_box(crop, label(stage), stage, transform, dataset, image_size, None, "Raw load", copies)
    if transform is not None:
        return Advice(
            summary=(
                "Raw load: reading and decoding each file. With no crop or resize in the transform there is nothing "
                "to skip while decoding: read less (fewer, larger files; local disk) or add workers if cores are idle."
            ),
            caveat="fastpipe's decode-the-crop drop-ins cannot help a pipeline that uses the whole image",
        )
    advice = decode_box(RRC_TORCH, "RandomResizedCrop", None, None, dataset, image_size, None, "Raw load", copies)
    return Advice(
        summary=advice.summary,
        snippet=advice.snippet,
        caveat="fastpipe did not see the transform: this assumes the usual RandomResizedCrop recipe"
        + ("; " + advice.caveat if advice.caveat else ""),
    )


def generated(label_: str, crop: str | None, dataset: str) -> Advice:
    """A raw load that makes its images in code (the toy's FakeDataset): no file is decoded, so no decode drop-in fits."""
    keep = (
        f" Make only what {crop} keeps: generate the crop's region alone and drop {crop} (the toy's FastFakeDataset("
        "crop_size=...) does, the stand-in for a decoder that decodes only the crop), or generate it faster "
        "(fastpipe.transforms.uniform_noise is ~10x np.random.randint)."
        if crop
        else " Generate less or faster (fastpipe.transforms.uniform_noise is ~10x np.random.randint), or add workers if cores are idle."
    )
    return Advice(
        summary=(
            f"{label_}: {dataset} generates each raw image in code (no file is read or decoded), so fastpipe's "
            f"decode-the-crop drop-ins (ImageFolder, DecodeCropLoader) do not apply.{keep}"
        )
    )
