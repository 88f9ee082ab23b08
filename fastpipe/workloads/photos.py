"""A real-photo JPEG corpus, made on this machine from photographs that Python packages ship.

Benchmarks of JPEG pipelines need real photographs: decode cost depends on image content,
size, quality, chroma subsampling and progressive coding, none of which random noise has.
ImageNet itself cannot be shipped or downloaded in a test, so :func:`build_corpus` cuts
random crops out of the photographs bundled with scikit-image (``skimage.data``) and
scikit-learn (``load_sample_images``), rescales them to ImageNet's size distribution
(typically 500x375, shorter side 300-500, landscape and portrait), and saves them as
JPEGs at qualities 75-95 with mixed chroma subsampling, some progressive, a few greyscale
and exactly one CMYK, in torchvision's ImageFolder layout. The result is deterministic for
a seed and cached: a marker file written last says that a build is complete.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fastpipe._system import usable_cores
from fastpipe.errors import ConfigError, OptionalDependencyError

#: Bump when the recipe changes, so cached corpora built by an older recipe are not reused.
CORPUS_VERSION = 1
MARKER = ".fastpipe-corpus.json"
BUILDING_MARKER = ".fastpipe-corpus-building.json"
DEFAULT_N = 2000
DEFAULT_CLASSES = 10

#: Colour photographs of skimage.data (``chelsea`` is also ``cat``), and greyscale ones.
SKIMAGE_COLOUR = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina", "stereo_motorcycle")
SKIMAGE_GREY = ("camera", "coins", "moon", "brick", "grass", "gravel")

#: (width / height, weight): ImageNet is mostly 4:3 landscape, with portraits and a tail of other shapes.
ASPECTS = ((4 / 3, 0.45), (3 / 2, 0.12), (3 / 4, 0.15), (2 / 3, 0.05), (1.0, 0.08), (16 / 9, 0.03))
OTHER_ASPECT_WEIGHT = 0.12  # the rest: log-uniform between 1:2 and 2:1
LONG_SIDE = 500  # ImageNet's most common long side (500x375, 500x333, 375x500)
LONG_SIDE_FRACTION = 0.7
SHORT_SIDE_RANGE = (300, 500)
QUALITY_RANGE = (75, 95)
GREY_FRACTION = 0.03
PROGRESSIVE_FRACTION = 0.15
SUBSAMPLING = ((2, 0.75), (1, 0.10), (0, 0.15))  # PIL codes: 2 = 4:2:0, 1 = 4:2:2, 0 = 4:4:4
PARALLEL_MIN_FILES = 400  # below this, starting processes costs more than it saves
MAX_BUILD_WORKERS = 8
CROP_AREA_RANGE = (0.5, 1.0)  # of the largest crop of the target aspect; keeps upscaling modest


@dataclass(frozen=True)
class Flavour:
    """How one file of the corpus is made: its pixels' source and size, and how it is encoded."""

    mode: str  # "RGB", "L" or "CMYK"
    size: tuple[int, int]  # (width, height)
    quality: int
    progressive: bool
    subsampling: int


def default_root(n: int, seed: int, classes: int = DEFAULT_CLASSES) -> Path:
    """``~/.cache/fastpipe/photos-<n>-<seed>`` (``$XDG_CACHE_HOME`` is honoured), with ``-c<classes>`` if not 10."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    suffix = "" if classes == DEFAULT_CLASSES else f"-c{classes}"
    return cache / "fastpipe" / f"photos-{n}-{seed}{suffix}"


def load_sources() -> tuple[list[Image.Image], list[Image.Image]]:
    """The colour and greyscale photographs to cut from, as PIL images (imports skimage and sklearn lazily)."""
    try:
        import skimage.data
        from sklearn.datasets import load_sample_images
    except ImportError as exc:
        raise OptionalDependencyError(
            f"the real-photo corpus is cut from photographs shipped with scikit-image and scikit-learn ({exc}); "
            "install them with: pip install 'fastpipe[photos]'"
        ) from exc
    colour = []
    for name in SKIMAGE_COLOUR:
        pixels = getattr(skimage.data, name)()
        if isinstance(pixels, tuple):  # stereo_motorcycle: (left, right, disparity)
            pixels = pixels[0]
        colour.append(Image.fromarray(np.ascontiguousarray(pixels[..., :3])))
    colour += [Image.fromarray(pixels) for pixels in load_sample_images().images]
    grey = [Image.fromarray(getattr(skimage.data, name)()) for name in SKIMAGE_GREY]
    return colour, grey


def _choose(rng: np.random.Generator, weighted: tuple[tuple[Any, float], ...]) -> Any:
    values, weights = zip(*weighted)
    return values[rng.choice(len(values), p=np.asarray(weights) / sum(weights))]


def draw_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) from ImageNet-like shapes: shorter side within 300-500, mostly a 500 long side."""
    if rng.random() < OTHER_ASPECT_WEIGHT:
        aspect = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))
    else:
        aspect = float(_choose(rng, ASPECTS))
    elongation = max(aspect, 1 / aspect)
    if rng.random() < LONG_SIDE_FRACTION:
        short = LONG_SIDE / elongation
    else:
        short = float(rng.integers(SHORT_SIDE_RANGE[0], SHORT_SIDE_RANGE[1] + 1))
    short = min(max(round(short), SHORT_SIDE_RANGE[0]), SHORT_SIDE_RANGE[1])
    long = round(short * elongation)
    return (long, short) if aspect >= 1 else (short, long)


def plan_flavours(n: int, seed: int) -> list[Flavour]:
    """Each file's flavour: which are greyscale, which one is CMYK, which are progressive, sizes, qualities."""
    master = np.random.default_rng([seed, n, CORPUS_VERSION])
    order = master.permutation(n)
    n_grey = max(1, round(GREY_FRACTION * n))
    grey, cmyk = set(order[:n_grey].tolist()), int(order[n_grey])
    progressive = set(master.choice(n, max(1, round(PROGRESSIVE_FRACTION * n)), replace=False).tolist())
    flavours = []
    for index in range(n):
        rng = np.random.default_rng([seed, index, CORPUS_VERSION])
        mode = "L" if index in grey else "CMYK" if index == cmyk else "RGB"
        quality = int(rng.integers(QUALITY_RANGE[0], QUALITY_RANGE[1] + 1))
        flavours.append(Flavour(mode, draw_size(rng), quality, index in progressive, int(_choose(rng, SUBSAMPLING))))
    return flavours


def render(flavour: Flavour, sources: list[Image.Image], rng: np.random.Generator) -> Image.Image:
    """A random crop of a random source with the flavour's aspect, resized to its size, in its mode."""
    source = sources[rng.integers(len(sources))]
    width, height = flavour.size
    aspect = width / height
    src_w, src_h = source.size
    max_w, max_h = (src_h * aspect, src_h) if src_w / src_h > aspect else (src_w, src_w / aspect)
    side = float(np.sqrt(rng.uniform(*CROP_AREA_RANGE)))
    crop_w, crop_h = max_w * side, max_h * side
    left, top = rng.uniform(0, src_w - crop_w), rng.uniform(0, src_h - crop_h)
    image = source.resize(flavour.size, Image.BICUBIC, box=(left, top, left + crop_w, top + crop_h))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return image if image.mode == flavour.mode else image.convert(flavour.mode)


def _save(image: Image.Image, flavour: Flavour, path: Path) -> None:
    """Write atomically, so a concurrent or interrupted build never leaves a half-written JPEG."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    options: dict[str, Any] = dict(quality=flavour.quality, progressive=flavour.progressive, optimize=flavour.progressive)
    if flavour.mode != "L":
        options["subsampling"] = flavour.subsampling
    image.save(partial, "JPEG", **options)
    os.replace(partial, path)


def class_name(index: int, classes: int) -> str:
    """``class_<k>``, zero-padded so that sorted order (torchvision's) is numeric order."""
    return f"class_{index:0{len(str(classes - 1))}d}"


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _claim(root: Path, config: dict[str, Any]) -> bool:
    """True if ``root`` already holds this corpus; else check it is ours to write and mark the build."""
    done = _read_marker(root / MARKER)
    if done == config:
        return True
    if done is not None:
        raise ConfigError(f"{root} holds a different fastpipe corpus ({done}); pass another root or delete that folder")
    building = _read_marker(root / BUILDING_MARKER)
    if building is not None and building != config:
        raise ConfigError(f"{root} holds an unfinished build of another corpus ({building}); pass another root or delete that folder")
    if building is None and root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} is not empty and is not a fastpipe corpus; pass an empty or new folder as root")
    root.mkdir(parents=True, exist_ok=True)
    (root / BUILDING_MARKER).write_text(json.dumps(config))
    return False


def _write_files(root: Path, n: int, seed: int, classes: int, indices: range) -> None:
    """Render and save files ``indices`` of the corpus; each file depends only on (seed, index), so any split gives the same bytes."""
    colour, grey = load_sources()
    flavours = plan_flavours(n, seed)
    for index in indices:
        flavour = flavours[index]
        rng = np.random.default_rng([seed, index, CORPUS_VERSION, 1])
        image = render(flavour, grey if flavour.mode == "L" else colour, rng)
        _save(image, flavour, root / class_name(index % classes, classes) / f"{index:05d}.jpg")


def _build_parallel(root: Path, n: int, seed: int, classes: int, workers: int) -> None:
    """Split the files over ``workers`` forked processes (PIL's encoder holds the GIL for much of its work)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    chunks = [range(start, n, workers) for start in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        for done in [pool.submit(_write_files, root, n, seed, classes, chunk) for chunk in chunks]:
            done.result()


def build_corpus(
    root: "str | os.PathLike[str] | None" = None,
    n: int = DEFAULT_N,
    seed: int = 0,
    classes: int = DEFAULT_CLASSES,
    workers: int | None = None,
    verbose: bool = False,
) -> Path:
    """Build (or reuse) a corpus of ``n`` real-photo JPEGs in ``root/class_<k>/<index>.jpg``; returns ``root``.

    Args:
        root: where to write; ``~/.cache/fastpipe/photos-<n>-<seed>`` by default. A folder that
            already holds this corpus (same n, seed, classes and recipe) is reused as is.
        n: number of files, at least ``classes`` (each class gets n / classes of them).
        seed: the same seed gives the same files, byte for byte with the same Pillow/libjpeg.
        classes: number of class folders; file ``i`` goes to class ``i % classes``.
        workers: processes to build with (default: the usable cores, up to 8; 1 for small corpora).
            The files do not depend on it.
        verbose: say on stderr when a build starts and ends (a first build takes seconds to a minute).

    Raises:
        OptionalDependencyError: scikit-image or scikit-learn is missing (``pip install 'fastpipe[photos]'``).
        ConfigError: bad sizes, or ``root`` holds something else.
    """
    if classes < 1 or n < max(classes, 2):
        raise ConfigError(
            f"build_corpus needs classes >= 1 and n >= max(classes, 2) so that no class folder is empty, got n={n}, classes={classes}"
        )
    root = Path(root) if root is not None else default_root(n, seed, classes)
    config = {"version": CORPUS_VERSION, "n": n, "seed": seed, "classes": classes}
    if _claim(root, config):
        return root
    load_sources()  # a missing optional dependency fails here, before any process starts
    if verbose:
        print(f"fastpipe: building the real-photo JPEG corpus ({n} files) in {root}, once; later runs reuse it", file=sys.stderr)
    for k in range(classes):
        (root / class_name(k, classes)).mkdir(exist_ok=True)
    if workers is None:
        workers = 1 if n < PARALLEL_MIN_FILES else min(MAX_BUILD_WORKERS, usable_cores())
    if workers > 1 and hasattr(os, "fork"):
        _build_parallel(root, n, seed, classes, min(workers, n))
    else:
        _write_files(root, n, seed, classes, range(n))
    (root / MARKER).write_text(json.dumps(config))  # last: its presence means the build is complete
    (root / BUILDING_MARKER).unlink(missing_ok=True)
    if verbose:
        print(f"fastpipe: corpus ready in {root}", file=sys.stderr)
    return root
