"""The code the advice prints: snippet templates, and the user's transforms written back as Python.

Snippets use the names a training script has: ``root`` (the image folder), ``transform`` (the dataset's transform,
unchanged), ``dataset``, ``loader``, ``device`` (a torch.device) and ``step(batch)``; the tests run them. Which
transform a writer may write out as torchvision code is decided by the catalog's facts (a torchvision crop of a
kind, the decoder's horizontal flip), never by a class name.
"""

from __future__ import annotations

import re

from fastpipe.diagnosis.discovery._catalog import FASTPIPE, TV1, TV2, facts_for
from fastpipe.diagnosis.verdict._remedies._pipeline import label, leaves, mean_std, out_size, replaced

DECODE_CROP_SNIPPET = """\
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

VALIDATION_SNIPPET = """\
from fastpipe.datasets import ImageFolder

# no change but the class: Resize + CenterCrop at the start of your transform are decoded in one pass, at the
# 1/2, 1/4 or 1/8 DCT scale that covers the resized size (print(dataset.fast_path) says what was taken over)
dataset = ImageFolder(root, transform=transform)  # was: torchvision.datasets.ImageFolder(root, transform=transform)
"""

UINT8_SNIPPET = """\
import torchvision.transforms as T
import torchvision.transforms.v2 as v2  # for v2.Resize(size=None, max_size=m), which v1 cannot write
from fastpipe.transforms import Normalize

# in the workers: uint8 out (PILToTensor), a quarter of float32's bytes, no per-pixel arithmetic
transform = T.Compose([{head}T.PILToTensor()])
# after the workers, your {fused} fused into one multiply-add on the whole batch:
normalize = Normalize(mean={mean}, std={std})
{loop}"""

BOX_LOADER_SNIPPET = """\
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

#: A box loader per crop kind (the catalog's :class:`~fastpipe.diagnosis.discovery._catalog.CropFacts` ``kind``):
#: the name of its function and the lines that compute its box and output size.
BOXES = {
    "random": (
        "random_crop",
        "    box = torchvision.transforms.RandomCrop.get_params(torch.empty(height, width), (size, size))\n    out_size = (size, size)\n",
    ),
    "center": ("center_crop", "    box = ((height - size) // 2, (width - size) // 2, size, size)\n    out_size = (size, size)\n"),
    "resize": (
        "resized",
        "    box = (0, 0, height, width)  # the whole image, shorter side scaled to size (DCT scaling when 2x or more)\n"
        "    out_size = (size, round(width * size / height)) if height <= width else (round(height * size / width), size)\n",
    ),
}

DEVICE_SNIPPET = """\
import fastpipe

# {name} on the device, after the copy, once per batch ({var}: your {name}; it must take a (N, C, H, W) tensor on the device)
def on_device(batch):
    images, labels = batch
    return {var}(images), labels

for batch in fastpipe.DevicePrefetcher(loader, device, transform=on_device):
    step(batch)
"""

MASK_SNIPPET = """\
import torchvision.transforms as T
from fastpipe.transforms import RandomMask

# on uint8, before any float conversion; warm_up() compiles once, before the workers start
transform = T.Compose([T.RandomResizedCrop({out}), T.PILToTensor(), RandomMask(ratio=0.25).warm_up()])
"""

PREFETCH_SNIPPET = """\
import fastpipe

# each batch pinned and copied non_blocking on a side stream, 2 batches ahead, while the step runs; with
# pin_memory=True in your DataLoader its pinning thread pins instead of this loop
for batch in fastpipe.DevicePrefetcher(loader, device, depth=2):
    step(batch)
"""

PAYLOAD_SNIPPET = """\
# what each batch ships from the workers: float32 images weigh 4x their uint8 pixels
images, labels = next(iter(loader))
print(images.dtype, tuple(images.shape), f"{images.element_size() * images.nelement() / 1e6:.1f} MB a batch")
"""

RECYCLED_LINES = """\
import fastpipe

loader = fastpipe.loading.recycled(loader)  # workers collate into a ring of reused shared-memory buffers, no fresh pages per batch
"""

TUNE_SNIPPET = """\
import fastpipe

# sweeps num_workers and prefetch_factor against the device bound (or: fastpipe tune SPEC)
print(fastpipe.tune(loader, step=step, device=device))
"""


def fmt(values: tuple[float, ...]) -> str:
    """A tuple of floats as Python, shortest form."""
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"


def snake(name: str) -> str:
    """``ConvertColor`` -> ``convert_color``: the name the snippet gives the user's transform."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def decode_crop(transform: object | None, copies: bool = True) -> str:
    """The decode-the-crop snippet for this pipeline: its output size, mean and std, and what uint8 out replaces."""
    mean, std = mean_std(transform)
    moved = "images.to(device, non_blocking=True)" if copies else "images"  # a CPU step: in the step, on the whole batch
    return DECODE_CROP_SNIPPET.format(out=out_size(transform), mean=fmt(mean), std=fmt(std), replaced=replaced(transform), moved=moved)


def interpolation_code(leaf: object) -> str:
    """``, interpolation=T.InterpolationMode.X`` for a transform that does not resize bilinearly (the default), else ``""``."""
    mode = getattr(leaf, "interpolation", None)
    name = getattr(mode, "name", None)  # an InterpolationMode; PIL's ints are left as the default
    return f", interpolation=T.InterpolationMode.{name}" if name and name != "BILINEAR" else ""


def resize_code(size: object, max_size: object, interpolation: str = "") -> str:
    """``Resize(size, max_size=max_size)`` as Python, the geometry exactly: v2's when ``size`` is None (v1 needs a size)."""
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]  # Resize([s]) is Resize(s)
    size_code = list(size) if isinstance(size, (list, tuple)) else size
    if size is None:
        return f"v2.Resize(size=None, max_size={max_size}{interpolation})"
    return f"T.Resize({size_code}" + (f", max_size={max_size}" if max_size is not None else "") + f"{interpolation})"


def _decode_stages() -> tuple[type, ...]:
    """fastpipe's decode stages (an ImageFolder's fast path), imported only when a pipeline holds one."""
    from fastpipe.datasets.crop import DecodeCrop
    from fastpipe.datasets.resized import DecodeResized

    return DecodeCrop, DecodeResized


def absorbed_code(stage: object) -> list[str]:
    """The torchvision transforms a decode stage of fastpipe's ImageFolder stands for, as Python."""
    decode_crop_type, _ = _decode_stages()
    code = []
    if isinstance(stage, decode_crop_type):
        code.append(
            f"T.RandomResizedCrop({list(getattr(stage, 'size'))}, scale={getattr(stage, 'scale')}, ratio={getattr(stage, 'ratio')})"
        )
    else:
        resize, max_size, crop = getattr(stage, "resize", None), getattr(stage, "max_size", None), getattr(stage, "crop", None)
        code += [resize_code(resize, max_size)] if resize is not None or max_size is not None else []
        code += [f"T.CenterCrop({list(crop)})"] if crop else []
    hflip = getattr(stage, "hflip", 0.0)
    return code + ([f"T.RandomHorizontalFlip(p={hflip})"] if hflip else [])


def _torchvision_code(leaf: object) -> str | None:
    """A torchvision crop, resize or horizontal flip as Python (``T.`` is v1, which v2's of these equal), by its facts;
    None for anything else."""
    facts = facts_for(leaf)
    if facts.library not in (TV1, TV2):
        return None
    size = getattr(leaf, "size", None)
    kind = facts.crop.kind if facts.crop is not None else None
    if kind == "resize":
        return resize_code(size, getattr(leaf, "max_size", None), interpolation_code(leaf))
    if kind == "random resized" and size is not None:
        scale, ratio = tuple(getattr(leaf, "scale", (0.08, 1.0))), tuple(getattr(leaf, "ratio", (3 / 4, 4 / 3)))
        return f"T.RandomResizedCrop({list(size)}, scale={scale}, ratio={ratio}{interpolation_code(leaf)})"
    if kind in ("center", "random") and size is not None:
        return f"T.{facts.name}({list(size) if isinstance(size, (list, tuple)) else size})"
    if facts.role == "flip" and facts.decoder_fuses:
        return f"T.RandomHorizontalFlip(p={getattr(leaf, 'p', 0.5)})"
    return None


def head(transform: object | None, stop: object | None) -> str:
    """The transforms before ``stop`` (the stage advised) and before the pipeline's PIL part ends, as Python, for the
    uint8 recipe; ones fastpipe cannot write out are named in a comment."""
    code, unknown = [], []
    for leaf in leaves(transform):
        facts = facts_for(leaf)
        if leaf is stop or facts.ends_pil:
            break
        written = _torchvision_code(leaf)
        if written is not None:
            code.append(written)
        elif facts.library == FASTPIPE and isinstance(leaf, _decode_stages()):
            code += absorbed_code(leaf)  # what fastpipe's ImageFolder took over, written back as the user's transforms
        else:
            unknown.append(label(leaf))
    text = "".join(c + ", " for c in code)
    return text + (f"  # and your {', '.join(unknown)}\n    " if unknown else "")
