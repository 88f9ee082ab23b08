"""What to do about a slow stage: its own remedy, fastpipe's drop-in for it, and when that cannot help.

A diagnosis that says "make it cheaper" leaves the user where they started. :func:`recommend`
names the remedy that fits the stage that was found (cropping is not sped up by a compiled
kernel; a Python pixel loop is), gives a snippet that runs against fastpipe's real API, and
says when a drop-in cannot pay off (DCT scaling on images smaller than twice the output).

Snippets use the names a training script has: ``root`` (the image folder), ``transform`` (the
dataset's transform, unchanged), ``dataset``, ``loader``, ``device`` (a torch.device) and ``step(batch)``.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Callable

from fastpipe.diagnosis.discovery._catalog import CUSTOM, FASTPIPE, TIMM, facts_for
from fastpipe.diagnosis.ladder._loader_stages import LoaderStageCosts
from fastpipe.diagnosis.ladder._plan import HAND_OVER
from fastpipe.diagnosis.verdict import _fits
from fastpipe.diagnosis.verdict._loader import LoaderFacts

RAW, TRANSFORM, COLLATE, COPY, WORKERS = "raw load", "transform", "collate/IPC", "host-to-device copy", "too few workers"
#: torchvision's RandomResizedCrop scale range: on average a box covers (0.08 + 1) / 2 of the image's area.
_DEFAULT_SCALE = (0.08, 1.0)
_DEFAULT_OUT = 224
_CROPS = ("RandomResizedCrop", "RandomCrop", "Resize", "CenterCrop")
_FLOAT_OUT = ("ToTensor", "Normalize", "ConvertImageDtype", "ToDtype", "MaybeToTensor")
_UINT8_OUT = ("PILToTensor", "MaybePILToTensor", "ToNumpy", "ToImage")
"""Conversions that keep a PIL image's uint8 pixels (a float conversion after one of them makes floats again)."""
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass(frozen=True)
class Advice:
    """One recommendation for one stage.

    Attributes:
        summary: one line: the stage's own remedy and fastpipe's drop-in for it.
        snippet: Python that applies the drop-in (using the script's ``root``, ``loader``, ``device``,
            ``step``), or None where no code fits every case.
        caveat: when the drop-in cannot help, or what fastpipe could not check; None when nothing applies.
    """

    summary: str
    snippet: str | None = None
    caveat: str | None = None

    def text(self) -> str:
        """Summary and caveat as one string, for a report's recommendation field."""
        return self.summary if self.caveat is None else f"{self.summary} Caveat: {self.caveat}"


def recommend(
    stage: str,
    kind: str,
    *,
    transform: object | None = None,
    dataset: object | None = None,
    image_size: tuple[int, int] | None = None,
    loader: LoaderFacts | None = None,
) -> Advice:
    """The remedy for ``stage``, a stage name as a diagnosis reports it.

    Args:
        stage: e.g. ``"RandomResizedCrop"``, ``"raw load"``, ``"collate/IPC"``, or a span measured as one
            (``"raw load + PILToTensor + collate/IPC"``), which is advised as a span, never as a transform.
        kind: ``"raw load"``, ``"transform"``, ``"collate/IPC"``, ``"host-to-device copy"`` or ``"too few workers"``.
        transform: the dataset's transform (a Compose, a list of its stages, or the stage itself): gives the
            output size, mean and std for the snippet, and shows whether a crop runs after ToTensor.
        dataset: the dataset; an ImageFolder-like one (``samples`` of (path, label)), or a wrapper holding
            one as ``.dataset``, lets a few image headers be read to say whether DCT scaling can help.
        image_size: (height, width) of a typical raw image, when the caller knows it.
        loader: what the device and the loader already do (:class:`~fastpipe.diagnosis.verdict._loader.LoaderFacts`):
            no copy advice where the device has no copy, and no advice to do what the loader already does.
    """
    loader = loader or LoaderFacts()
    parts = [part.strip() for part in stage.split(" + ") if part.strip()]
    if len(parts) > 1:
        return _span(parts, transform, dataset, image_size, loader)
    name = parts[0] if parts else stage
    base = re.sub(r"#\d+$", "", name)
    if kind == WORKERS:
        return _workers()
    if base == RAW or kind == RAW:
        return _with_prepare(_raw_load(transform, dataset, image_size, loader.copies), dataset)
    if base == COLLATE or kind == COLLATE:
        return _collate(transform, dataset, loader)
    if base == COPY or kind == COPY:
        return _copy(transform, loader)
    return _transform(base, transform, dataset, image_size, loader)


# ----- what fastpipe can learn about the pipeline ----------------------------------------------
def _leaves(transform: object | None) -> list[object]:
    """The stages of a Compose, a list of stages, a preset class holding a Compose, or one stage, flattened as a
    diagnosis finds them."""
    return _fits.leaves(transform)


def _find(transform: object | None, name: str) -> tuple[object | None, list[str]]:
    """The stage called ``name`` in ``transform`` and the class names before it."""
    leaves = _leaves(transform)
    names = [type(leaf).__name__ for leaf in leaves]
    if name in names:
        i = names.index(name)
        return leaves[i], names[:i]
    return None, []


def _out_size(transform: object | None) -> int:
    for leaf in _leaves(transform):
        size = getattr(leaf, "size", None) if type(leaf).__name__ in _CROPS or facts_for(leaf).crop is not None else None
        if isinstance(size, int):
            return size
        if isinstance(size, (list, tuple)) and size:
            return int(min(size))
    return _DEFAULT_OUT


def _mean_std(transform: object | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    normalize, _ = _find(transform, "Normalize")
    mean, std = getattr(normalize, "mean", None), getattr(normalize, "std", None)
    if mean is None or std is None:
        return _IMAGENET
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def samples_of(dataset: object | None) -> list[object]:
    """The (path, label) samples (or paths) of the image folder the dataset reads, through the wrappers that keep it as
    ``.dataset`` (Subset, most user wrappers) and the readers that hold its file list (timm's ImageDataset keeps it in
    ``.reader.samples``); torchvision's ``samples`` or ``imgs``. Empty when the dataset lists no files."""
    for _ in range(4):
        for holder in (dataset, getattr(dataset, "reader", None)):
            for attr in ("samples", "imgs"):
                found = getattr(holder, attr, None) if holder is not None else None
                if isinstance(found, (list, tuple)) and found:
                    return list(found)
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            break
    return []


def _image_size(dataset: object | None, image_size: tuple[int, int] | None, probe: int = 8) -> tuple[int, int] | None:
    """(height, width) of a typical raw image: given, or the median of a few headers of the files the dataset reads
    (:func:`samples_of`)."""
    if image_size is not None:
        return image_size
    samples = samples_of(dataset)
    if not samples:
        return None
    from PIL import Image

    sizes = []
    for sample in samples[:probe]:
        path = sample[0] if isinstance(sample, (list, tuple)) else sample
        try:
            with Image.open(path) as img:  # reads the header only
                sizes.append((img.height, img.width))
        except (OSError, TypeError, ValueError):
            continue
    if not sizes:
        return None
    return int(statistics.median(h for h, _ in sizes)), int(statistics.median(w for _, w in sizes))


def _crop_caveat(crop: str, size: tuple[int, int] | None, out: int) -> str | None:
    """When decoding only the box cannot pay as hoped. DCT scaling (1/2, 1/4, 1/8) needs a box at least twice the output."""
    if crop in ("RandomCrop", "CenterCrop"):
        if size is None:
            return None
        share = min(1.0, out * out / (size[0] * size[1]))
        return (
            f"{crop} keeps the output's size, so there is no DCT scaling; decoding only the box decodes about "
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
    if crop == "Resize":
        return (
            f"on {width}x{height} images to {out} px the drop-in cannot help: the whole image is decoded either way, "
            f"and its short side ({min(height, width)} px) is under twice the output ({2 * out} px), so there is no DCT scaling"
        )
    mean_area = sum(_DEFAULT_SCALE) / 2
    return (
        f"on {width}x{height} images to {out} px, DCT scaling cannot help: even the largest crop box "
        f"({min(height, width)} px) is under twice the output ({2 * out} px), so the box is decoded at full "
        f"resolution; decoding only the box still skips the pixels outside it (on average {1 - mean_area:.0%} of the "
        "image with RandomResizedCrop's default scale), so measure it with `fastpipe compare` before relying on it"
    )


def _crop_of(transform: object | None) -> str | None:
    """The first crop or resize in the pipeline (by the catalog, any library's): what a decoder could do while decoding."""
    return next(
        (type(leaf).__name__ for leaf in _leaves(transform) if facts_for(leaf).crop is not None or type(leaf).__name__ in _CROPS), None
    )


# ----- the remedies ----------------------------------------------------------------------------
_DECODE_CROP_SNIPPET = """\
import torchvision
from fastpipe.datasets import DecodeCropLoader, ImageFolder
from fastpipe.transforms import Normalize

# no change but the class: your own transform; the crop (and flip) it begins with is decoded crop-only,
# with torchvision's random draws (print(dataset.fast_path) says what was taken over)
dataset = ImageFolder(root, transform=transform)  # was: torchvision.datasets.ImageFolder(root, transform=transform)
# further: uint8 out, Normalize after the workers (replaces your {replaced}):
# dataset = ImageFolder(root, size={out})
# normalize = Normalize(mean={mean}, std={std})  # images = normalize({moved})
# or keep torchvision's class, with the crop drawn and decoded by its loader (no transform):
# dataset = torchvision.datasets.ImageFolder(root, loader=DecodeCropLoader({out}))
"""

_VALIDATION_SNIPPET = """\
from fastpipe.datasets import ImageFolder

# no change but the class: Resize + CenterCrop at the start of your transform are decoded in one pass, at the
# 1/2, 1/4 or 1/8 DCT scale that covers the resized size (print(dataset.fast_path) says what was taken over)
dataset = ImageFolder(root, transform=transform)  # was: torchvision.datasets.ImageFolder(root, transform=transform)
"""

_UINT8_SNIPPET = """\
import torchvision.transforms as T
import torchvision.transforms.v2 as v2  # for v2.Resize(size=None, max_size=m), which v1 cannot write
from fastpipe.transforms import Normalize

# in the workers: uint8 out (PILToTensor), a quarter of float32's bytes, no per-pixel arithmetic
transform = T.Compose([{head}T.PILToTensor()])
# after the workers, your {fused} fused into one multiply-add on the whole batch:
normalize = Normalize(mean={mean}, std={std})
{loop}"""

_BOX_LOADER_SNIPPET = """\
import torch
import torchvision
from fastpipe.ops.jpeg import decode_jpeg_crop, jpeg_size

def decode_{what}(path, size={out}):
    \"\"\"{name}({out}) decoded alone from the file, uint8 (3, h, w) out: a loader= for torchvision's ImageFolder.\"\"\"
    data = open(path, "rb").read()
    height, width = jpeg_size(data)
{box}    return decode_jpeg_crop(data, box, out_size)

dataset = torchvision.datasets.ImageFolder(root, loader=decode_{what})  # drop {name}{convert} from its transform
"""

_BOXES = {
    "RandomCrop": (
        "random_crop",
        "    box = torchvision.transforms.RandomCrop.get_params(torch.empty(height, width), (size, size))\n    out_size = (size, size)\n",
    ),
    "CenterCrop": ("center_crop", "    box = ((height - size) // 2, (width - size) // 2, size, size)\n    out_size = (size, size)\n"),
    "Resize": (
        "resized",
        "    box = (0, 0, height, width)  # the whole image, shorter side scaled to size (DCT scaling when 2x or more)\n"
        "    out_size = (size, round(width * size / height)) if height <= width else (round(height * size / width), size)\n",
    ),
}

_DEVICE_SNIPPET = """\
import fastpipe

# {name} on the device, after the copy, once per batch ({var}: your {name}; it must take a (N, C, H, W) tensor on the device)
def on_device(batch):
    images, labels = batch
    return {var}(images), labels

for batch in fastpipe.DevicePrefetcher(loader, device, transform=on_device):
    step(batch)
"""

_MASK_SNIPPET = """\
import torchvision.transforms as T
from fastpipe.transforms import RandomMask

# on uint8, before any float conversion; warm_up() compiles once, before the workers start
transform = T.Compose([T.RandomResizedCrop({out}), T.PILToTensor(), RandomMask(ratio=0.25).warm_up()])
"""

_PREFETCH_SNIPPET = """\
import fastpipe

# each batch pinned and copied non_blocking on a side stream, 2 batches ahead, while the step runs; with
# pin_memory=True in your DataLoader its pinning thread pins instead of this loop
for batch in fastpipe.DevicePrefetcher(loader, device, depth=2):
    step(batch)
"""

_PAYLOAD_SNIPPET = """\
# what each batch ships from the workers: float32 images weigh 4x their uint8 pixels
images, labels = next(iter(loader))
print(images.dtype, tuple(images.shape), f"{images.element_size() * images.nelement() / 1e6:.1f} MB a batch")
"""

_RECYCLED_LINES = """\
import fastpipe

loader = fastpipe.loading.recycled(loader)  # workers collate into a ring of reused shared-memory buffers, no fresh pages per batch
"""

_TUNE_SNIPPET = """\
import fastpipe

# sweeps num_workers and prefetch_factor against the device bound (or: fastpipe tune SPEC)
print(fastpipe.tune(loader, device, step=step))
"""


def _fmt(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"


_TO_TENSOR = ("ToTensor", "PILToTensor", "MaybeToTensor", "MaybePILToTensor", "ToImage")
"""Conversions from a PIL image to a tensor: a decoder that returns the tensor itself replaces them."""


def _conversion_after(transform: object | None) -> str:
    """`` (and X)`` for the pipeline's conversion to a tensor (X), which a decoder returning uint8 tensors replaces."""
    found = next((type(leaf).__name__ for leaf in _leaves(transform) if type(leaf).__name__ in _TO_TENSOR), None)
    return f" (and {found})" if found else ""


def _replaced(transform: object | None) -> str:
    """What ``ImageFolder(root, size=...)`` replaces, named from the pipeline found: its crop, a flip and its
    conversion to a tensor (the usual recipe, said as such, when fastpipe saw no transform)."""
    if transform is None:
        return "RandomResizedCrop + RandomHorizontalFlip + ToTensor (the usual recipe: fastpipe did not see yours)"
    names = [type(leaf).__name__ for leaf in _leaves(transform)]
    crop = _crop_of(transform)
    kept = [n for n in names if n == crop or n == "RandomHorizontalFlip" or n in _TO_TENSOR or n in ("ConvertImageDtype", "ToDtype")]
    return " + ".join(kept) or "crop"


def _decode_crop(transform: object | None, copies: bool = True) -> str:
    mean, std = _mean_std(transform)
    moved = "images.to(device, non_blocking=True)" if copies else "images"  # a CPU step: in the step, on the whole batch
    return _DECODE_CROP_SNIPPET.format(out=_out_size(transform), mean=_fmt(mean), std=_fmt(std), replaced=_replaced(transform), moved=moved)


def _decode_box(
    crop: str,
    stage: object | None,
    transform: object | None,
    dataset: object | None,
    image_size: tuple[int, int] | None,
    converted: str | None,
    label: str,
    copies: bool = True,
) -> Advice:
    """Decode only what ``crop`` keeps: the remedy for a crop or resize, and for the raw load before one.

    Only where it applies: a raw load that generates its images decodes no file (:func:`_generated`), and fastpipe's
    ImageFolder is named only where its fast path takes the crop over (else the report says why not).
    """
    generated = _fits.generated_raw_load(dataset)
    if generated is not None:
        return _generated(label, crop, generated)
    out = _out_size(transform if stage is None else stage)
    caveat = _crop_caveat(crop, _image_size(dataset, image_size), out)
    if converted:
        caveat = f"{crop} runs after {converted}, on a tensor of the whole image: move it before the conversion (the drop-in does both)" + (
            "; " + caveat if caveat else ""
        )
    what = "resized" if crop == "Resize" else "cropped"
    fast = _fits.fast_path(transform, dataset) if transform is not None else None
    argument = _fits.transform_argument(dataset)
    taken = fast is None or (fast.active and crop in fast.absorbed)
    if not taken and crop not in _BOXES:
        why = fast.why_not if not fast.active else f"it takes over {' + '.join(fast.absorbed)}, not {crop}"
        return Advice(
            summary=f"{label}: the image is decoded whole to be {what} by {crop}. {_fits.not_absorbed(crop, stage, why)}",
            snippet=_TUNE_SNIPPET,
            caveat=caveat,
        )
    if crop in ("Resize", "CenterCrop") and not converted and taken:
        return Advice(
            summary=(
                f"{label}: the image is decoded whole to be {what} by {crop}. Change only the dataset class: "
                f"fastpipe.datasets.ImageFolder(root, transform={argument}) decodes Resize and CenterCrop at the "
                "start of the transform in one pass, at the DCT scale (1/2, 1/4, 1/8) that still covers the resized size."
            ),
            snippet=_fits.snippet_for(_VALIDATION_SNIPPET, dataset),
            caveat=caveat,
        )
    if crop in _BOXES:
        name, box = _BOXES[crop]
        return Advice(
            summary=(
                f"{label}: the image is decoded whole to be {what} by {crop}. {'Scale' if crop == 'Resize' else 'Crop'} while "
                "decoding: fastpipe.ops.jpeg.decode_jpeg_crop decodes only the box (at 1/2, 1/4 or 1/8 DCT scale when the "
                "box is at least twice the output), uint8 out, as the loader of torchvision's ImageFolder."
            ),
            snippet=_BOX_LOADER_SNIPPET.format(what=name, name=crop, out=out, box=box, convert=_conversion_after(transform)),
            caveat=caveat,
        )
    return Advice(
        summary=(
            f"{label}: the image is decoded whole to be {what} by {crop}. Decode only the crop, changing only the dataset "
            f"class: fastpipe.datasets.ImageFolder(root, transform={argument}) draws torchvision's box from the "
            f"header and decodes only it (then, for uint8 out, fastpipe.datasets.ImageFolder(root, size={out}); or "
            f"DecodeCropLoader({out}) as the loader of torchvision's ImageFolder)."
        ),
        snippet=_fits.snippet_for(_decode_crop(transform, copies), dataset),
        caveat=caveat,
    )


def _raw_load(transform: object | None, dataset: object | None, image_size: tuple[int, int] | None, copies: bool = True) -> Advice:
    stream = _stream_raw_load(dataset)
    if stream is not None:
        return stream
    generated = _fits.generated_raw_load(dataset)
    if generated is not None:
        return _generated("Raw load", _crop_of(transform), generated)
    crop = _crop_of(transform)
    if crop is not None:
        stage, _ = _find(transform, crop)
        return _decode_box(crop, stage, transform, dataset, image_size, None, "Raw load", copies)
    if transform is not None:
        return Advice(
            summary=(
                "Raw load: reading and decoding each file. With no crop or resize in the transform there is nothing "
                "to skip while decoding: read less (fewer, larger files; local disk) or add workers if cores are idle."
            ),
            caveat="fastpipe's decode-the-crop drop-ins cannot help a pipeline that uses the whole image",
        )
    advice = _decode_box("RandomResizedCrop", None, None, dataset, image_size, None, "Raw load", copies)
    return Advice(
        summary=advice.summary,
        snippet=advice.snippet,
        caveat="fastpipe did not see the transform: this assumes the usual RandomResizedCrop recipe"
        + ("; " + advice.caveat if advice.caveat else ""),
    )


def _generated(label: str, crop: str | None, dataset: str) -> Advice:
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
            f"{label}: {dataset} generates each raw image in code (no file is read or decoded), so fastpipe's "
            f"decode-the-crop drop-ins (ImageFolder, DecodeCropLoader) do not apply.{keep}"
        )
    )


def _stream_raw_load(dataset: object | None) -> Advice | None:
    """The raw load of a streaming dataset (an ``IterableDataset``), or None for a map-style one.

    A stream has no ``__getitem__`` to speed up and no image folder to swap: its raw load is reading items in order.
    For a WebDataset chain that is the shard read: webdataset splits the shard list among nodes and DataLoader workers
    (``split_by_node``, ``split_by_worker``), never single samples, so workers read in parallel only as many shards as
    there are (its docs: round-robin needs at least as many shards as workers; ``resampled=True`` draws shards with
    replacement and ``with_epoch`` sets the epoch's length instead)."""
    from torch.utils.data import IterableDataset

    if not isinstance(dataset, IterableDataset):
        return None
    shards = webdataset_shards(dataset)
    if shards is None:
        return Advice(
            summary=(
                f"Raw load: reading the stream's items in order ({type(dataset).__name__}.__iter__ and its source), in "
                "each worker's own share of the stream. Read faster or in parallel: local or faster storage, larger "
                "sequential reads, and a source split among the DataLoader workers (get_worker_info()) so that more "
                "num_workers read different items at once; a shuffle buffer on raw (encoded) items, not random reads."
            )
        )
    if shards.resampled:
        parallel = (
            f"its {shards.count} shards are drawn with replacement (resampled=True), so every worker has shards to "
            "read: raise num_workers while cores are idle, with with_epoch setting each worker's epoch"
        )
    else:
        empty = (
            "more workers than that fail (a worker with no shard raises 'No samples found' unless the WebDataset is "
            "built with empty_check=False, and then reads nothing)"
            if shards.empty_check
            else "a worker with no shard reads nothing (empty_check=False)"
        )
        parallel = (
            f"this chain lists {shards.count} shards, dealt out to the workers whole, so at most {shards.per_rank()} "
            f"num_workers read at once{shards.ranks_text()}; {empty}; to read with more workers, write the data as "
            "more, smaller shards, or read with resampled=True and with_epoch"
        )
    batching = (
        "the chain batches already, so read its batches whole (DataLoader(batch_size=None)) and whole batches cross from the workers."
        if shards.batches
        else "batch inside the chain (.batched, with DataLoader(batch_size=None)) so whole batches cross from the workers."
    )
    return Advice(
        summary=(
            "Raw load: the shard read (opening each tar shard, reading it in order and grouping each sample's files; "
            "a .decode() in the chain is a stage of its own). WebDataset splits shards, not samples, among nodes and DataLoader "
            f"workers, so read more shards in parallel: {parallel}. Keep the reads sequential and local: shards on local "
            "or fast storage, large enough to stream; shuffle with shardshuffle=<n> (the order of whole shards) and "
            f".shuffle(<n>) (a sample buffer), never by random access; {batching}"
        )
    )


@dataclass(frozen=True)
class ShardList:
    """What a WebDataset chain's shard list allows in parallel: ``count`` shards listed, drawn with replacement
    (``resampled``), split among ``ranks`` processes first when ``split_by_node`` is in the chain (``by_node``; the world
    size this process sees, 1 outside a distributed run), whether a worker with no shard raises (``empty_check``, the
    WebDataset default), and whether the chain already ``batches``."""

    count: int
    resampled: bool
    empty_check: bool
    by_node: bool
    ranks: int
    batches: bool

    def per_rank(self) -> int:
        """Shards one rank reads: ``split_by_node`` deals them out round-robin, so the first ranks get the extra one."""
        return -(-self.count // self.ranks) if self.by_node and self.ranks > 1 else self.count

    def ranks_text(self) -> str:
        """How the shards are shared among ranks, when ``split_by_node`` shares them."""
        if not self.by_node:
            return ""
        if self.ranks > 1:
            return f" (split_by_node deals the {self.count} shards among {self.ranks} ranks: at most {self.per_rank()} per rank)"
        return " per rank when not distributed (split_by_node divides them among the ranks of a distributed run: shards / world size each)"

    def limit_text(self, needed: int) -> str | None:
        """When ``needed`` workers (the waiting text's estimate) exceed the shards one rank reads: the shards are the
        limit, and the sentence says so; None when they are not, or when shards are drawn with replacement."""
        if self.resampled or needed <= self.per_rank():
            return None
        return (
            f"This chain cannot give those {needed} workers a shard each: a rank reads at most {self.per_rank()} shards "
            "at once, so the shards, not num_workers, are the limit (write more, smaller shards, or read with "
            "resampled=True and with_epoch)."
        )


def webdataset_shards(dataset: object) -> ShardList | None:
    """The shard list of a WebDataset chain (:class:`ShardList`), read from its steps; None for another stream."""
    import sys

    wds = sys.modules.get("webdataset")
    if wds is None or not isinstance(dataset, wds.DataPipeline):
        return None
    steps = list(getattr(dataset, "pipeline", []))
    names = {getattr(step, "__name__", None) for step in steps}
    batched = getattr(wds.filters.batched, "f", None)
    for step in steps:
        urls = getattr(step, "urls", None)
        if isinstance(urls, (list, tuple)):
            by_node = "split_by_node" in names
            return ShardList(
                count=len(urls),
                resampled=type(step).__name__ == "ResampledShards",
                empty_check="check_empty" in names,
                by_node=by_node,
                ranks=max(1, int(wds.utils.pytorch_worker_info()[1])) if by_node else 1,
                batches=any(batched is not None and getattr(each, "f", None) is batched for each in steps),
            )
    return None


def _transform(
    name: str, transform: object | None, dataset: object | None, image_size: tuple[int, int] | None, loader: LoaderFacts | None = None
) -> Advice:
    loader = loader or LoaderFacts()
    stage, before = _find(transform, name)
    # the float conversions fastpipe's ImageFolder keeps from the user's transform (its ToTensor) are not compiled parts:
    # their remedy is uint8 out and Normalize on the device, as for torchvision's
    if _is_fastpipe_part(stage) and name != "RandomMask" and name not in _FLOAT_OUT:
        return _with_prepare(_fastpipe_part(name, dataset), dataset)
    facts = facts_for(stage) if stage is not None else None
    # a library transform (by the catalog) is already native: its remedy comes from what it is, never "compile it"
    library = facts is not None and facts.library not in (CUSTOM, FASTPIPE) and not facts.compile_helps
    converted = next((n for n in before if n in _TO_TENSOR), None)
    if name in _CROPS or (library and facts is not None and facts.crop is not None):
        return _decode_box(name, stage, transform, dataset, image_size, converted, name, loader.copies)
    fast = _fits.fast_path(transform, dataset) if library and transform is not None and _fits.generated_raw_load(dataset) is None else None
    takes_over = set(fast.absorbed) if fast is not None and fast.active else set()
    if (
        library
        and facts is not None
        and ((name in ("RandomHorizontalFlip", "PILToTensor") and name not in takes_over) or (name == "ToTensor" and facts.library == TIMM))
    ):
        summary, on_device = _fits.library_transform(name, facts, _fits.crop_before(stage, transform), copies=loader.copies)
        return Advice(summary=summary, snippet=_DEVICE_SNIPPET.format(name=name, var=_snake(name)) if on_device else _TUNE_SNIPPET)
    if name in _FLOAT_OUT:
        return _float_out(name, transform, loader)
    if name == "RandomHorizontalFlip":
        return Advice(
            summary=(
                "RandomHorizontalFlip: a copy of every pixel. fastpipe's decode-the-crop drop-ins flip while they resize, "
                f"at no extra cost: fastpipe.datasets.ImageFolder(root, transform={_fits.transform_argument(dataset)}) takes a flip right "
                f"after the crop over (or ImageFolder(root, size={_out_size(transform)}, hflip=0.5) for uint8 out)."
            ),
            snippet=_fits.snippet_for(_decode_crop(transform, loader.copies), dataset),
        )
    if name == "PILToTensor":
        return Advice(
            summary=(
                "PILToTensor: it copies every pixel it is given; crop before it, or let the decoder return the "
                f"cropped uint8 tensor itself: fastpipe.datasets.ImageFolder(root, transform={_fits.transform_argument(dataset)}) drops a "
                f"PILToTensor that follows the crop (or ImageFolder(root, size={_out_size(transform)}))."
            ),
            snippet=_fits.snippet_for(_decode_crop(transform, loader.copies), dataset),
        )
    if name == "RandomMask" and not _is_fastpipe_mask(stage):
        return Advice(
            summary=(
                "RandomMask: a per-pixel loop in Python. fastpipe.transforms.RandomMask is a compiled drop-in "
                "(Numba or a C++ op, same distribution and in-place contract); apply it to uint8, before converting to float."
            ),
            snippet=_MASK_SNIPPET.format(out=_out_size(transform)),
        )
    if library and facts is not None:
        summary, on_device = _fits.library_transform(name, facts, _fits.crop_before(stage, transform), copies=loader.copies)
        return Advice(summary=summary, snippet=_DEVICE_SNIPPET.format(name=name, var=_snake(name)) if on_device else _TUNE_SNIPPET)
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
        snippet=_DEVICE_SNIPPET.format(name=name, var=_snake(name)),
    )


def _float_out(name: str, transform: object | None, loader: LoaderFacts) -> Advice:
    """A float conversion or Normalize in the workers: ship uint8 and normalize after the workers, named by the
    pipeline's own conversions (a preset that converts with ConvertImageDtype is never told about ToTensor)."""
    names = [type(leaf).__name__ for leaf in _leaves(transform)]
    floats = [n for n in names if n in _FLOAT_OUT] or [name]
    kept = next((n for n in names if n in _UINT8_OUT and names.index(n) < names.index(floats[0])), None) if floats[0] in names else None
    ship = f"your {kept}'s uint8, before {floats[0]}" if kept else "PILToTensor"
    mean, std = _mean_std(transform)
    where = _normalize_where(loader)
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
            f"fastpipe.transforms.Normalize, which matches your {' + '.join(floats)}."
        ),
        snippet=_UINT8_SNIPPET.format(head=_head(transform, name), mean=_fmt(mean), std=_fmt(std), fused=" + ".join(floats), loop=loop),
    )


def _interpolation_code(leaf: object) -> str:
    """``, interpolation=T.InterpolationMode.X`` for a transform that does not resize bilinearly (the default), else ``""``."""
    mode = getattr(leaf, "interpolation", None)
    name = getattr(mode, "name", None)  # an InterpolationMode; PIL's ints are left as the default
    return f", interpolation=T.InterpolationMode.{name}" if name and name != "BILINEAR" else ""


def _resize_code(size: object, max_size: object, interpolation: str = "") -> str:
    """``Resize(size, max_size=max_size)`` as Python, the geometry exactly: v2's when ``size`` is None (v1 needs a size)."""
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]  # Resize([s]) is Resize(s)
    size_code = list(size) if isinstance(size, (list, tuple)) else size
    if size is None:
        return f"v2.Resize(size=None, max_size={max_size}{interpolation})"
    return f"T.Resize({size_code}" + (f", max_size={max_size}" if max_size is not None else "") + f"{interpolation})"


def _absorbed_code(stage: object) -> list[str]:
    """The torchvision transforms a decode stage of fastpipe's ImageFolder stands for, as Python."""
    code = []
    if type(stage).__name__ == "DecodeCrop":
        code.append(
            f"T.RandomResizedCrop({list(getattr(stage, 'size'))}, scale={getattr(stage, 'scale')}, ratio={getattr(stage, 'ratio')})"
        )
    else:
        resize, max_size, crop = getattr(stage, "resize", None), getattr(stage, "max_size", None), getattr(stage, "crop", None)
        code += [_resize_code(resize, max_size)] if resize is not None or max_size is not None else []
        code += [f"T.CenterCrop({list(crop)})"] if crop else []
    hflip = getattr(stage, "hflip", 0.0)
    return code + ([f"T.RandomHorizontalFlip(p={hflip})"] if hflip else [])


def _head(transform: object | None, stop: str) -> str:
    """The transforms before ``stop`` as Python, for the uint8 recipe; ones fastpipe cannot write out are named in a comment."""
    code, unknown = [], []
    for leaf in _leaves(transform):
        name = type(leaf).__name__
        if name == stop or name in _FLOAT_OUT or name in ("ToTensor", "PILToTensor"):
            break
        size = getattr(leaf, "size", None)
        if name == "Resize":
            code.append(_resize_code(size, getattr(leaf, "max_size", None), _interpolation_code(leaf)))
        elif name == "RandomResizedCrop" and size is not None:
            scale, ratio = tuple(getattr(leaf, "scale", (0.08, 1.0))), tuple(getattr(leaf, "ratio", (3 / 4, 4 / 3)))
            code.append(f"T.RandomResizedCrop({list(size)}, scale={scale}, ratio={ratio}{_interpolation_code(leaf)})")
        elif name in _CROPS and size is not None:
            code.append(f"T.{name}({list(size) if isinstance(size, (list, tuple)) else size})")
        elif name == "RandomHorizontalFlip":
            code.append(f"T.RandomHorizontalFlip(p={getattr(leaf, 'p', 0.5)})")
        elif name in ("DecodeCrop", "DecodeResized") and _is_fastpipe_part(leaf):
            code += _absorbed_code(leaf)  # what fastpipe's ImageFolder took over, written back as the user's transforms
        else:
            unknown.append(name)
    text = "".join(c + ", " for c in code)
    return text + (f"  # and your {', '.join(unknown)}\n    " if unknown else "")


_DROP_IN_PACKAGES = ("fastpipe.datasets", "fastpipe.transforms", "fastpipe.ops", "fastpipe.loading")
"""Where fastpipe's drop-in parts live (not ``fastpipe.workloads``, whose naive pipelines are deliberately slow user code)."""


def _is_fastpipe_part(stage: object | None) -> bool:
    """One of fastpipe's own compiled parts (DecodeCrop, JpegRandomResizedCrop, ...): compiling it again cannot help."""
    module = type(stage).__module__ if stage is not None else ""
    return any(module == package or module.startswith(package + ".") for package in _DROP_IN_PACKAGES)


def _fastpipe_part(name: str, dataset: object | None = None) -> Advice:
    summary = (
        f"{name}: fastpipe's own part, already native code, so rewriting it will not help. Give it more CPU: "
        "more workers where cores are idle (`fastpipe tune SPEC`, or fastpipe.tune, finds the fewest that keep up and "
        "watches shared memory), or take its work off the CPU: decode on the device (fastpipe.datasets.EncodedImageFolder "
        "with DecodeCropOnDevice, as the jpeg:device workload does) where a GPU decoder is available."
    )
    if _thread_loader_fits(dataset):
        summary += f" Or spend less CPU around it: {_THREAD_LOADER}."
    return Advice(summary=summary, snippet=_TUNE_SNIPPET)


#: The ThreadLoader remedy, for a JPEG folder read by fastpipe's ImageFolder whose crop is decoded by DecodeCrop.
_THREAD_LOADER = (
    "no worker processes at all for this JPEG folder: fastpipe.datasets.ThreadLoader(dataset, batch_size=..., shuffle=True, "
    "threads=<cores>) decodes whole batches with threads in one process, with no per-sample Python, collate or copies "
    "between processes, one copy of the dataset and no /dev/shm (bench_jpeg.py --thread-loader compares it with the DataLoader)"
)


def _folder(dataset: object | None) -> object | None:
    """The ImageFolder-like dataset under wrappers that keep it as ``.dataset`` (Subset and most user wrappers)."""
    for _ in range(4):
        if getattr(dataset, "samples", None) is not None or getattr(dataset, "dataset", None) is None:
            break
        dataset = getattr(dataset, "dataset")
    return dataset


def _thread_loader_fits(dataset: object | None) -> bool:
    """fastpipe's ImageFolder with its crop absorbed into a DecodeCrop: what the ThreadLoader's batch op decodes."""
    folder = _folder(dataset)
    fast_path = getattr(folder, "fast_path", None)
    return type(folder).__module__.startswith("fastpipe.datasets") and type(getattr(fast_path, "decode", None)).__name__ == "DecodeCrop"


#: How much of each file the progressive probe reads: the frame header follows the APPn segments (EXIF, ICC), which
#: rarely reach this far; a file whose header lies beyond it is not counted as probed.
HEADER_PROBE_BYTES = 256 * 1024


def _progressive(dataset: object | None, probe: int = 16) -> tuple[int, int]:
    """(progressive JPEGs, JPEG files probed) among the first ``probe`` samples of an ImageFolder-like dataset.

    Reads at most :data:`HEADER_PROBE_BYTES` of each file (a shard or a huge file is not read whole) and only paths
    (a str or ``os.PathLike``: an int would be taken by ``open`` as one of the process's file descriptors and closed).
    """
    samples = samples_of(dataset)
    if not samples:
        return 0, 0
    import os

    import torch

    from fastpipe.ops.jpeg import is_jpeg, is_progressive, sof_offset

    found = probed = 0
    for sample in samples[:probe]:
        path = sample[0] if isinstance(sample, (list, tuple)) and sample else sample
        if not isinstance(path, (str, os.PathLike)):
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_PROBE_BYTES)
        except (OSError, ValueError):
            continue
        data = torch.frombuffer(bytearray(head), dtype=torch.uint8) if head else torch.empty(0, dtype=torch.uint8)
        if not is_jpeg(data) or sof_offset(head) is None:
            continue
        probed += 1
        found += is_progressive(data)
    return found, probed


def _prepare_line(found: int, probed: int) -> str:
    """What the progressive probe found, as advice (empty when nothing was probed)."""
    if found:
        return (
            f" {found} of {probed} files probed are progressive JPEGs, several times slower to decode than baseline: "
            "`fastpipe prepare ROOT NEW_ROOT` copies the folder with them rewritten losslessly as baseline (pixels identical), "
            "the rest hard-linked; train on NEW_ROOT."
        )
    if probed:
        return f" None of the {probed} files probed is a progressive JPEG, so `fastpipe prepare` would not make them faster."
    return ""


def _with_prepare(advice: Advice, dataset: object | None) -> Advice:
    """Add ``fastpipe prepare`` where the folder has progressive JPEGs (several times slower to decode than baseline)."""
    found, probed = _progressive(dataset)
    if not found:
        return advice
    return Advice(summary=advice.summary + _prepare_line(found, probed), snippet=advice.snippet, caveat=advice.caveat)


def _is_fastpipe_mask(stage: object | None) -> bool:
    from fastpipe.transforms.mask import RandomMask

    return isinstance(stage, RandomMask)


def _snake(name: str) -> str:
    """``ConvertColor`` -> ``convert_color``: the name the snippet gives the user's transform."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def ships_uint8(transform: object | None) -> bool | None:
    """Whether the pipeline found hands out uint8 images: its last conversion keeps uint8 (PILToTensor, timm's
    MaybePILToTensor or ToNumpy, v2's ToImage) with no float conversion after it. None when it has no conversion
    fastpipe knows (then nothing is said either way)."""
    kept = None
    for name in (type(leaf).__name__ for leaf in _leaves(transform)):
        if name in _FLOAT_OUT:
            kept = False
        elif name in _UINT8_OUT:
            kept = True
    return kept


def _normalize_where(loader: LoaderFacts) -> str:
    """Where a Normalize taken out of the workers runs: after the copy, or in a CPU step on whole batches."""
    return "on the device" if loader.copies else "in the training step, on whole batches"


def _collate(transform: object | None, dataset: object | None = None, loader: LoaderFacts | None = None) -> Advice:
    loader = loader or LoaderFacts()
    floats = [n for n in (type(leaf).__name__ for leaf in _leaves(transform)) if n in _FLOAT_OUT]
    recycled = _recycled_available()
    send = (
        "the images are uint8 already, so: smaller dtypes for the rest, no padding, a lower resolution"
        if ships_uint8(transform)
        else f"uint8 images (PILToTensor, normalize {_normalize_where(loader)} with fastpipe.transforms.Normalize), smaller dtypes, no padding"
    )
    summary = f"Collate/IPC: every batch is packed by a worker, passed through shared memory and unpacked. Send less: {send}"
    summary += ", and reuse batch memory with fastpipe.loading.recycled(loader, slots=...)." if recycled else "."
    if _thread_loader_fits(dataset):
        summary += f" Or {_THREAD_LOADER}."
    caveat = f"your transform ends in {', '.join(floats)}: float32 out, 4x the bytes of uint8" if floats else None
    return Advice(summary=summary, snippet=_PAYLOAD_SNIPPET + ("\n" + _RECYCLED_LINES if recycled else ""), caveat=caveat)


def _recycled_available() -> bool:
    """Recycled batch memory is a newer part of fastpipe: advise it only where it is there."""
    import importlib.util

    try:
        return importlib.util.find_spec("fastpipe.loading.recycle") is not None
    except (ImportError, ValueError):
        return False


def _copy(transform: object | None = None, loader: LoaderFacts | None = None) -> Advice:
    """The copy's remedies, less the ones the loader already has (a prefetcher, pinning, uint8 batches)."""
    loader = loader or LoaderFacts()
    if not loader.copies:
        return Advice(summary="Host-to-device copy: this device reads its batches where the loader leaves them; there is no copy.")
    todo, done = [], []
    if loader.pinned:
        done.append("pin_memory=True pins each batch")
    else:
        todo.append("pin_memory=True")
    if loader.prefetcher:
        done.append(f"{loader.prefetcher} copies each batch ahead of the step")
    else:
        todo.append("non_blocking copies on a side stream with fastpipe.DevicePrefetcher")
    if ships_uint8(transform):
        done.append("the pipeline ships uint8 images")
    else:
        todo.append("uint8 payloads (normalize on the device)")
    summary = "Host-to-device copy: " + (f"overlap it with the step and copy less: {', '.join(todo)}." if todo else "")
    if done:
        summary += f" Already in place: {'; '.join(done)}" + (
            "." if todo else ": what is left is the bytes themselves (a lower resolution or smaller dtypes)."
        )
    summary += " fastpipe.loading.recycled(loader) also pins each batch buffer once, so no pin copy runs per batch."
    return Advice(summary=summary.replace(":  ", ": "), snippet=None if loader.prefetcher else _PREFETCH_SNIPPET)


def _workers() -> Advice:
    return Advice(
        summary=(
            "Too few workers: the input is late while the CPU has idle cores. Find the fewest workers that keep up "
            "with `fastpipe tune SPEC` (or fastpipe.tune), which also watches shared memory."
        ),
        snippet=_TUNE_SNIPPET,
    )


def _span(
    parts: list[str], transform: object | None, dataset: object | None, image_size: tuple[int, int] | None, loader: LoaderFacts
) -> Advice:
    """Stages measured together (an interrupted or bisected run): which part costs the time is not known."""
    kinds: dict[str, Callable[[], Advice]] = {
        RAW: lambda: _raw_load(transform, dataset, image_size, loader.copies),
        COLLATE: lambda: _collate(transform, dataset, loader),
        COPY: lambda: _copy(transform, loader),
        HAND_OVER: lambda: Advice(
            summary="hand-over: the ThreadLoader giving decoded batches to the loop (ring views and buffer release), not a "
            "transform; its own clocks time it with the loader's other stages."
        ),
    }
    advice = [kinds[p]() if p in kinds else _transform(re.sub(r"#\d+$", "", p), transform, dataset, image_size, loader) for p in parts]
    first = next((a for a in advice if a.snippet is not None), None)
    remedies = " ".join(a.summary for a in advice)
    return Advice(
        summary=(
            f"{' + '.join(parts)} were measured as one span, so their time is not split between them: "
            f"`fastpipe costs SPEC` times each inside the workers. The remedies, part by part: {remedies}"
        ),
        snippet=None if first is None else first.snippet,
        caveat="; ".join(a.caveat for a in advice if a.caveat) or None,
    )


def recommend_loader_stage(
    costs: LoaderStageCosts,
    dataset: object | None,
    cores: int,
    *,
    threads: int | None = None,
    batch_size: int | None = None,
    saturated: bool = False,
) -> Advice | None:
    """The remedy for an input-bound loader that times its own stages (the ThreadLoader): its dominant stage's.

    The ladder says how much the input costs each step; the loader's clocks say which of its threads spends the
    time, so the advice names that stage: decode (more ``threads=`` while cores are free, ``fastpipe prepare`` for
    progressive JPEGs), read (storage: one thread reads), or the generic path's per-image ``dataset[i]`` and collate.
    None when no stage was timed. ``threads`` is the loader's setting (the native threads in all, which the clocks
    also count); more threads help only up to twice the batch size (two decoding threads) and the cores, and not at all when
    the CPU was ``saturated`` during the baseline (the reading and loop threads need a share of it too).
    """
    top = costs.dominant()
    if top is None:
        return None
    share = "" if math.isnan(top.share_of_step) else f", {top.share_of_step:.0%} of the loop's {costs.step_ms:.1f} ms step"
    per_image = "" if top.ms_per_image is None else f" ({top.ms_per_image:.2f} ms per image)"
    spends = "spend" if top.thread.endswith("threads") else "spends"
    head = f"In the {costs.loader}, {top.stage} dominates: the {top.thread} {spends} {top.ms_per_step:.1f} ms per step on {top.what}{per_image}{share}."
    if top.stage == "decode":
        setting = threads if threads is not None else max(1, round(top.threads or 1.0))
        # two decoding threads, each starting at most one native thread per image of its batch
        useful = min(cores, 2 * batch_size) if batch_size else cores
        off_cpu = (
            "take the decode off the CPU where a GPU decoder is available (fastpipe.datasets.EncodedImageFolder with "
            "DecodeCropOnDevice, as jpeg:device-decode does)."
        )
        if saturated:
            fix = f" The cores were saturated during the run (threads={setting}, {cores} cores here), so more threads will not help; {off_cpu}"
        elif setting < useful:
            fix = (
                f" Give it more native threads: threads={useful} (now {setting}; {cores} cores here, {batch_size or 'n/a'} images a batch)."
            )
        elif useful < cores:  # the batch, not the cores, is the limit
            fix = (
                f" With threads={setting} it already has as many native threads as batches of {batch_size} images can use "
                f"(one per image, two batches at once; {cores} cores here), so more threads will not help; a larger "
                f"batch_size would let more cores decode, or {off_cpu}"
            )
        else:
            fix = f" With threads={setting} it already has the {cores} cores here, so more threads will not help; {off_cpu}"
        return Advice(summary=head + fix + _prepare_line(*_progressive(dataset)))
    if top.stage == "read":
        return Advice(
            summary=head + " Storage sets the pace: one thread reads the files, so threads= (decoders) cannot help; put the "
            "folder on faster or local storage (a local SSD, or memory when it fits), and a deeper prefetch= only evens out bursts."
        )
    if top.stage == "load + collate":
        return Advice(
            summary=head + " The transform was not absorbed by the batch op, so images are loaded one at a time in the loop's "
            "thread: give fastpipe's ImageFolder size= (or Compose([RandomResizedCrop, RandomHorizontalFlip, PILToTensor]), "
            "normalizing on the device with fastpipe.transforms.Normalize) so whole batches are decoded by threads, or keep "
            "this transform in a DataLoader with workers."
        )
    return Advice(summary=head + " This stage is bookkeeping in Python, not the decode; please report it with this report's JSON.")
