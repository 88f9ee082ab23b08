"""What a 224x224 training sample costs from a JPEG file: fastpipe's decode-and-crop op against the usual recipes and peers.

Every candidate turns a file path into one RandomResizedCrop(224) + horizontal-flip sample,
the way a Dataset's ``__getitem__`` does (read the file, decode, crop, resize, flip):

* ``pil-recipe``: PIL open + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize (float out);
* ``pil-recipe-uint8``: the same with PILToTensor (uint8 out, no Normalize);
* ``torchvision-v2``: torchvision.io.decode_jpeg + v2.RandomResizedCrop(224) + v2.RandomHorizontalFlip, uint8;
* ``fastpipe``: ``fastpipe.ops.jpeg``: header size, torchvision's ``RandomResizedCrop.get_params``, the crop-decode op;
* ``entropy-floor``: fastpipe's path with the decode cut down to the Huffman decoding of every block
  above the box's last row (every scan of a progressive file), which any libjpeg-based decoder must
  do before it has the box's pixels: the lowest cost the op could reach. A speed goal that needs
  less than this is out of reach for a libjpeg decode, and the targets table says so;
* ``fastpipe-portable-resize``, ``fastpipe-no-resize``: fastpipe's path with the op's resize forced to its
  portable kernels, or skipped (output unwritten), for the whole timed pass
  (``torch.ops.fastpipe._jpeg_set_resize_kernel``): the dispatched (AVX2) resize against the portable one, and
  the resize's share of the op, in the same rounds (rows absent when the loaded op cannot choose);
* ``pil-decode``, ``torchvision-decode``: a full decode alone, for scale;
* peers, each optional (a row says "not installed" or why it cannot run): ``simplejpeg`` (decode +
  v2 crop), NVIDIA DALI's CPU pipeline (``Pipeline(device_id=None)``, ``fn.decoders.image_random_crop``,
  ``fn.resize``, ``fn.flip``; wall time per image with ``--threads`` threads) and SPDL (FFmpeg crop + scale).

One thread (``torch.set_num_threads(1)``), as one DataLoader worker has. Candidates run in a
shuffled order every round, each over the whole file list, and the rounds repeat, so the shared
machine's load falls on all of them alike; the table gives the median over rounds of each
round's mean cost per image, the spread (min-max over rounds), and each candidate's ratio to
fastpipe measured in the same run. Single-thread rows are thread CPU time; DALI works in its
own threads, so its row and fastpipe's comparison row are wall time. A second table runs the
main recipes through a DataLoader with ``--workers`` worker processes and gives images/s.

Writes ``bench_jpeg.json``, ``bench_jpeg.md`` and ``bench_jpeg.png`` under ``--out``. Exits 1 when
one of the targets is not met in this run (the tables are written either way), and when a target
could not be measured (DALI not installed, or the loader table skipped): it prints
``NOT MEASURED: <target>: <reason>``, and only ``--allow-missing`` lets the run pass without it.

``--dropin`` runs only the drop-in table instead: for the classic training recipe
(RandomResizedCrop(224) + flip + ToTensor + Normalize) and validation recipe (Resize(256) +
CenterCrop(224) + ToTensor + Normalize), ``torchvision.datasets.ImageFolder(root, transform=recipe)[i]``
against ``fastpipe.datasets.ImageFolder(root, transform=recipe)[i]`` with the same seed: the crop
boxes each drew, the pixels' mean absolute difference, and each one's cost per image, side by
side (``bench_jpeg_dropin.{md,json}``; exits 1 if the boxes or pixels disagree). ``--upscale 4``
runs it on the files enlarged 4x (``bench_jpeg_dropin_x4.*``): camera-sized photos, where the
validation resize decodes at a DCT scale.

Usage:
    python benchmarks/bench_jpeg.py [--root FOLDER] [--n 300] [--rounds 5] [--workers 2] [--threads 1] [--allow-missing]
    python benchmarks/bench_jpeg.py --dropin [--root CLASS_FOLDERS] [--n 300] [--rounds 5] [--upscale 4]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import fastpipe.ops.jpeg as fjpeg

SIZE = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Row:
    name: str
    what: str
    clock: str  # "thread CPU" or "wall"
    per_round_ms: list[float] = field(default_factory=list)  # mean ms per image, one per round
    status: str = "ok"  # or why it did not run

    @property
    def median_ms(self) -> float:
        return statistics.median(self.per_round_ms) if self.per_round_ms else float("nan")


# ------------------------------------------------------------------------------------------
# Corpus


def corpus_files(root: str | None, n: int) -> tuple[list[Path], str]:
    """JPEG paths (sorted, at most n) and where they came from."""
    if root is not None:
        files = sorted(p for p in Path(root).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        if not files:
            sys.exit(f"bench_jpeg: no .jpg/.jpeg files under {root}")
        return files[:n], f"{root} ({len(files[:n])} files)"
    try:
        from fastpipe.workloads.photos import build_corpus

        built = build_corpus(n=n, seed=0)
        return sorted(built.rglob("*.jpg"))[:n], f"fastpipe.workloads.photos.build_corpus(n={n}, seed=0) at {built}"
    except ImportError as exc:  # scikit-image / scikit-learn missing: a synthetic stand-in, said so
        return _synthetic_corpus(n), f"synthetic gradients + noise ({exc}); install fastpipe[photos] for real photos"


def _synthetic_corpus(n: int) -> list[Path]:
    from PIL import Image

    folder = Path.home() / ".cache" / "fastpipe" / f"bench-jpeg-synthetic-{n}"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        path = folder / f"{i:05d}.jpg"
        files.append(path)
        if path.exists():
            continue
        w, h = (500, 375) if i % 3 else (375, 500)
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * (0.3 + i % 5 / 10), y * 0.5, 128 + 80 * np.sin(x / (9 + i % 7)) * np.cos(y / 13.0)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path, quality=int(75 + i % 21), progressive=i % 7 == 0)
    return files


# ------------------------------------------------------------------------------------------
# Candidates: each is a function path -> sample.


def main_candidates() -> dict[str, tuple[str, Callable[[Path], Any]]]:
    import torchvision.io as tio
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2
    from PIL import Image

    pil_float = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    pil_uint8 = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.PILToTensor()])
    tv_v2 = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)

    def pil_open(path: Path) -> Any:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")

    def fastpipe_sample(path: Path) -> torch.Tensor:
        data = fjpeg.read_bytes(path)
        height, width = fjpeg.jpeg_size(data)
        box = T.RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(1, height, width), scale, ratio)
        return fjpeg.decode_jpeg_crop(data, box, (SIZE, SIZE), hflip=bool(torch.rand(1) < 0.5))

    def entropy_floor(path: Path) -> int:
        # fastpipe's path up to the decode, then only the Huffman decoding no libjpeg decoder can skip
        data = fjpeg.read_bytes(path)
        height, width = fjpeg.jpeg_size(data)
        top, _, box_h, _ = T.RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(1, height, width), scale, ratio)
        bool(torch.rand(1) < 0.5)  # the flip's draw, as fastpipe's path makes it
        return torch.ops.fastpipe._jpeg_entropy_floor(data, top + box_h) if fjpeg.is_jpeg(data) else 0

    def tv_decode(path: Path) -> torch.Tensor:
        return tio.decode_jpeg(tio.read_file(str(path)), mode=tio.ImageReadMode.RGB)

    return {
        "pil-recipe": ("PIL open + RandomResizedCrop(224) + flip + ToTensor + Normalize (float)", lambda p: pil_float(pil_open(p))),
        "pil-recipe-uint8": ("the same, PILToTensor (uint8, no Normalize)", lambda p: pil_uint8(pil_open(p))),
        "torchvision-v2": ("torchvision.io.decode_jpeg + v2 RandomResizedCrop + flip (uint8)", lambda p: tv_v2(tv_decode(p))),
        "fastpipe": (f"fastpipe.ops.jpeg.decode_jpeg_crop, box from get_params ({fjpeg.jpeg_op_status()})", fastpipe_sample),
        **(
            {
                "entropy-floor": (
                    "fastpipe's path, but only the Huffman decoding of the rows above the box's last row (all scans if progressive): no libjpeg decode can cost less",
                    entropy_floor,
                )
            }
            if fjpeg.JPEG_OP_AVAILABLE
            else {}
        ),
        **(
            {
                "fastpipe-portable-resize": (
                    "fastpipe, its resize forced to the portable kernels (the SSE2 / compiler-vectorised ones it had before the AVX2 ones)",
                    fastpipe_sample,
                ),
                "fastpipe-no-resize": (
                    "fastpipe with both resize passes skipped (output unwritten): the op's decode alone, for the resize's share",
                    fastpipe_sample,
                ),
            }
            if resize_kernels_available()
            else {}
        ),
        "pil-decode": ("PIL decode alone, full image", pil_open),
        "torchvision-decode": ("torchvision.io.decode_jpeg alone, full image", tv_decode),
    }


# The resize kernel each fastpipe candidate runs with (torch.ops.fastpipe._jpeg_set_resize_kernel), set for
# the whole timed pass, so all three run in the same rounds and nothing per image is added to any of them.
RESIZE_KERNEL = {"fastpipe": "auto", "fastpipe-wall": "auto", "fastpipe-portable-resize": "portable", "fastpipe-no-resize": "skip"}


def resize_kernels_available() -> bool:
    """Whether the loaded op can choose its resize kernels (a fastpipe._jpeg built with csrc/jpeg/resize.cpp)."""
    return fjpeg.JPEG_OP_AVAILABLE and hasattr(torch.ops.fastpipe, "_jpeg_set_resize_kernel")


def with_resize_kernel(kernel: str | None, run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` with the op's resize kernel set to ``kernel`` while it runs (unchanged when None or not available)."""
    if kernel is None or not resize_kernels_available():
        return run

    def wrapped() -> Any:
        before = torch.ops.fastpipe._jpeg_set_resize_kernel(kernel)
        try:
            return run()
        finally:
            torch.ops.fastpipe._jpeg_set_resize_kernel(before)

    return wrapped


def resize_summary(rows: dict[str, Row]) -> list[str]:
    """The resize kernels' figures from this run's rows (issue 25, item 3): the op path with each kernel, the resize's
    share, and each one's ratio to the entropy floor."""
    names = ("fastpipe", "fastpipe-portable-resize", "fastpipe-no-resize", "entropy-floor")
    if not all(n in rows and rows[n].status == "ok" and rows[n].per_round_ms for n in names):
        return []
    fast, portable, skipped, floor = (rows[n].median_ms for n in names)
    kernel = torch.ops.fastpipe._jpeg_resize_kernels()[0]
    return [
        f"Resize kernels, this run (thread CPU, ms per image, medians): fastpipe with the dispatched kernel ({kernel}) {fast:.3f}, "
        f"with the portable kernel {portable:.3f} ({portable / fast:.2f}x), with the resize skipped {skipped:.3f}. "
        f"The resize costs {portable - skipped:.3f} ms portable and {fast - skipped:.3f} ms dispatched "
        f"({(fast - skipped) / fast:.0%} of fastpipe's per-sample cost); "
        f"per sample / entropy floor: dispatched {fast / floor:.2f}x, portable {portable / floor:.2f}x, with no resize at all {skipped / floor:.2f}x "
        "(goal <= 1.3x).",
        "",
    ]


def simplejpeg_candidate() -> tuple[str, Callable[[Path], Any] | None, str]:
    what = "simplejpeg.decode_jpeg (full; PIL for CMYK) + v2 RandomResizedCrop + flip (uint8)"
    try:
        import simplejpeg
    except ImportError:
        return what, None, "not installed (pip install 'fastpipe[peers]')"
    import torchvision.transforms.v2 as v2

    crop = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])

    from PIL import Image

    def sample(path: Path) -> torch.Tensor:
        data = path.read_bytes()
        try:
            pixels = simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:  # what it cannot decode (CMYK), a user would hand to PIL
            pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        return crop(torch.from_numpy(pixels).permute(2, 0, 1))

    return what, sample, "ok"


def spdl_candidate() -> tuple[str, Callable[[Path], Any] | None, str]:
    what = "SPDL spdl.io.load_image, FFmpeg crop + scale + hflip filter, to_torch (uint8; needs the system's FFmpeg libraries)"
    try:
        import spdl.io
    except ImportError:
        return what, None, "not installed (pip install spdl; it also needs the system's FFmpeg libraries, e.g. libavcodec59 libavfilter8)"
    except Exception as exc:  # e.g. the FFmpeg libraries it loads are missing
        return what, None, f"cannot import: {type(exc).__name__}: {exc}"
    import torchvision.transforms as T

    def sample(path: Path) -> Any:
        height, width = fjpeg.jpeg_size(path)
        top, left, h, w = T.RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(1, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
        flip = ",hflip" if random.random() < 0.5 else ""
        desc = f"crop={w}:{h}:{left}:{top},scale={SIZE}:{SIZE}{flip},format=rgb24"
        return spdl.io.to_torch(spdl.io.load_image(str(path), filter_desc=desc))  # uint8 (224, 224, 3)

    return what, sample, "ok"


def dali_epoch(files: list[Path], threads: int, batch: int) -> tuple[Callable[[], float] | None, str]:
    """A function that runs one epoch of DALI's CPU pipeline and returns its wall seconds, or the reason it cannot."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError:
        return None, "not installed (pip install 'fastpipe[dali]', i.e. nvidia-dali-cuda120)"
    except Exception as exc:
        return None, f"cannot import: {type(exc).__name__}: {exc}"

    names = [str(p) for p in files]

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, prefetch_queue_depth=1)
    def pipe() -> Any:
        jpegs, _ = fn.readers.file(files=names, random_shuffle=False, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip())

    try:
        p = pipe()
        p.build()
        iterations = -(-len(names) // batch)

        def epoch() -> float:
            """Seconds for len(files) images (the last batch wraps around the list, so scale to the images asked for)."""
            start = time.perf_counter()
            for _ in range(iterations):
                p.run()
            return (time.perf_counter() - start) * len(names) / (iterations * batch)

        epoch()  # warm-up
        return epoch, "ok"
    except Exception as exc:
        return None, f"cannot run: {type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------
# Timing


def time_rounds(
    rows: dict[str, Row], fns: dict[str, Callable[[], "float | list[float]"]], rounds: int, n_images: int
) -> dict[str, list[list[float]]]:
    """Each round runs every candidate once in a fresh random order.

    A candidate returns the seconds for the whole list, or a list of seconds per file (kept,
    per round, in the returned dict for the per-flavour breakdown).
    """
    per_file: dict[str, list[list[float]]] = {name: [] for name in fns}
    order = list(fns)
    shuffler = random.Random(0)
    for r in range(rounds):
        shuffler.shuffle(order)
        for name in order:
            result = fns[name]()
            if isinstance(result, list):
                per_file[name].append(result)
                result = sum(result)
            rows[name].per_round_ms.append(result * 1e3 / n_images)
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{k} {rows[k].per_round_ms[-1]:.2f}" for k in sorted(fns)), flush=True)
    return per_file


def over_files(fn: Callable[[Path], Any], files: list[Path], clock: Callable[[], float]) -> Callable[[], list[float]]:
    def run() -> list[float]:
        times = []
        for path in files:
            start = clock()
            fn(path)
            times.append(clock() - start)
        return times

    return run


def flavours(files: list[Path]) -> dict[str, list[int]]:
    """File indices by kind: progressive JPEGs decode all their scans whatever the crop, so they cost several times more."""
    from PIL import Image

    groups: dict[str, list[int]] = {"baseline": [], "progressive": []}
    for i, path in enumerate(files):
        with Image.open(path) as im:
            groups["progressive" if im.info.get("progressive") else "baseline"].append(i)
    return groups


def flavour_table(
    per_file: dict[str, list[list[float]]], groups: dict[str, list[int]], names: list[str]
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Median over rounds of the mean ms per image within each group, and the ratio to fastpipe's."""
    medians: dict[str, dict[str, float]] = {}
    for name in names:
        if not per_file.get(name):
            continue
        medians[name] = {
            group: statistics.median(sum(times[i] for i in idx) * 1e3 / len(idx) for times in per_file[name])
            for group, idx in groups.items()
            if idx
        }
    kinds = [g for g, idx in groups.items() if idx]
    lines = [
        "| candidate | " + " | ".join(f"{g} ({len(groups[g])} files) ms, x fastpipe" for g in kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for name, by_group in medians.items():
        cells = [f"{by_group[g]:.3f}, {by_group[g] / medians['fastpipe'][g]:.2f}x" for g in kinds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines, medians


class _Samples(torch.utils.data.Dataset):
    def __init__(self, files: list[Path], fn: Callable[[Path], Any]) -> None:
        self.files, self.fn = files, fn

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        return self.fn(self.files[index])


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)


def loader_epoch(files: list[Path], fn: Callable[[Path], Any], workers: int, batch: int) -> Callable[[], float]:
    loader = torch.utils.data.DataLoader(
        _Samples(files, fn), batch_size=batch, num_workers=workers, persistent_workers=workers > 0, worker_init_fn=_worker_init
    )

    def epoch() -> float:
        start = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - start

    epoch()  # starts the workers and warms their caches
    return epoch


def header_costs(files: list[Path], repeats: int = 3) -> dict[str, float]:
    """Microseconds per file to read (height, width) from bytes in memory: fastpipe's marker walk vs PIL's lazy open."""
    from PIL import Image

    datas = [fjpeg.read_bytes(p) for p in files]
    raw = [p.read_bytes() for p in files]

    def walk() -> None:
        for d in datas:
            fjpeg.jpeg_size(d)

    def pil() -> None:
        for b in raw:
            with Image.open(io.BytesIO(b)) as im:
                im.size  # noqa: B018

    best = {"jpeg_size (marker walk)": float("inf"), "PIL lazy Image.open": float("inf")}
    for _ in range(repeats):
        for name, fn in (("jpeg_size (marker walk)", walk), ("PIL lazy Image.open", pil)):
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - start) * 1e6 / len(files))
    return best


# ------------------------------------------------------------------------------------------
# Output


def table(rows: list[Row], reference: str, unit: str = "ms / image") -> list[str]:
    """Ratios against fastpipe on the same clock: thread-CPU rows against ``reference``, wall rows against ``reference``-wall."""
    refs = {
        "thread CPU": next((r.median_ms for r in rows if r.name == reference), float("nan")),
        "wall": next((r.median_ms for r in rows if r.name == f"{reference}-wall"), float("nan")),
    }
    lines = [
        f"| candidate | what | clock | {unit} (median) | spread over rounds | x fastpipe's cost (same clock) |",
        "|---|---|---|---:|---|---:|",
    ]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.name} | {r.what} | | {r.status} | | |")
            continue
        spread = f"{min(r.per_round_ms):.3f}-{max(r.per_round_ms):.3f}"
        lines.append(f"| {r.name} | {r.what} | {r.clock} | {r.median_ms:.3f} | {spread} | {r.median_ms / refs[r.clock]:.2f} |")
    return lines


def loader_table(rows: list[Row]) -> list[str]:
    ref = next(r.median_ms for r in rows if r.name.startswith("fastpipe"))
    lines = ["| candidate | images/s (median) | spread (images/s) | fastpipe's images/s / this |", "|---|---:|---|---:|"]
    for r in rows:
        rates = [1e3 / ms for ms in r.per_round_ms]
        lines.append(f"| {r.name} | {statistics.median(rates):.0f} | {min(rates):.0f}-{max(rates):.0f} | {r.median_ms / ref:.2f} |")
    return lines


NOT_MEASURED = "NOT MEASURED"


def issue_targets(rows: dict[str, Row], loader_rows: list[Row], loader_status: str = "ok") -> list[tuple[str, float, str]]:
    """The targets' ratios, each measured in this run: (target, ratio, verdict).

    A target that could not be measured (a peer that did not run) has ratio nan and the verdict
    ``NOT MEASURED: <reason>``; ``loader_status`` says why the loader table has no DALI row.
    """
    fast = rows["fastpipe"].median_ms
    out: list[tuple[str, float, str]] = []

    floor = rows["entropy-floor"].median_ms if "entropy-floor" in rows else None

    def add(name: str, value: float, goal: float, at_floor: float | None = None) -> None:
        verdict = "PASS" if value >= goal else f"FAIL (goal {goal:g}x)"
        if value < goal and at_floor is not None and at_floor < goal:
            verdict += f"; out of reach: at the entropy-decoding floor it would still be {at_floor:.2f}x"
        out.append((name, value, verdict))

    def at_floor(peer: str) -> float | None:
        return rows[peer].median_ms / floor if floor else None

    add("cost: usual PIL recipe / fastpipe >= 4x", rows["pil-recipe"].median_ms / fast, 4, at_floor("pil-recipe"))
    add("cost: torchvision.io + v2 / fastpipe >= 2x", rows["torchvision-v2"].median_ms / fast, 2, at_floor("torchvision-v2"))
    single = "images/s, 1 thread: fastpipe / DALI CPU >= 2x (wall)"
    if rows["dali-cpu"].status == "ok":
        add(single, rows["dali-cpu"].median_ms / rows["fastpipe-wall"].median_ms, 2)
    else:
        out.append((single, float("nan"), f"{NOT_MEASURED}: DALI CPU {rows['dali-cpu'].status}"))
    by_name = {r.name.split(" (")[0]: r for r in loader_rows}
    if "dali-cpu" in by_name and "fastpipe" in by_name:
        threads = by_name["dali-cpu"].name.split("(")[1].split()[0]
        add(
            f"images/s, {threads} workers / threads: fastpipe / DALI CPU >= 2x",
            by_name["dali-cpu"].median_ms / by_name["fastpipe"].median_ms,
            2,
        )
    else:
        out.append(
            (
                "images/s, DataLoader workers / DALI threads: fastpipe / DALI CPU >= 2x",
                float("nan"),
                f"{NOT_MEASURED}: DALI CPU {loader_status}",
            )
        )
    return out


def exit_status(targets: list[tuple[str, float, str]], allow_missing: bool) -> int:
    """Print a ``NOT MEASURED: <target>: <reason>`` line for each target not measured; 1 when one was missed, or
    not measured without ``allow_missing``."""
    missing = [(name, verdict) for name, _, verdict in targets if verdict.startswith(NOT_MEASURED)]
    for name, verdict in missing:
        print(f"{NOT_MEASURED}: {name}: {verdict[len(NOT_MEASURED) + 2 :]}")
    if missing and allow_missing:
        print(f"{len(missing)} target(s) not measured; --allow-missing: they do not decide the exit status")
    failed = any(verdict.startswith("FAIL") for _, _, verdict in targets)
    return 1 if failed or (missing and not allow_missing) else 0


def plot(rows: list[Row], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (pip install matplotlib)"
    ok = [r for r in rows if r.status == "ok"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ok) + 1.2))
    names = [f"{r.name} ({r.clock})" for r in ok]
    medians = [r.median_ms for r in ok]
    errors = [[m - min(r.per_round_ms) for m, r in zip(medians, ok)], [max(r.per_round_ms) - m for m, r in zip(medians, ok)]]
    colours = ["tab:green" if r.name.startswith("fastpipe") else "tab:gray" for r in ok]
    ax.barh(names, medians, xerr=errors, color=colours)
    ax.invert_yaxis()
    ax.set_xlabel("ms per 224x224 sample, one thread (median over rounds; bars: min-max)")
    ax.set_title("JPEG file to training sample")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ------------------------------------------------------------------------------------------
# The drop-in: fastpipe.datasets.ImageFolder(root, transform=the_same_transform) against torchvision's class

#: fastpipe.ops.jpeg's documented tolerance against PIL: mean absolute difference in 0..255 levels when the
#: decoder scales in the DCT (under 0.5 when it does not).
DROPIN_TOLERANCE = 2.5


def dropin_recipes() -> dict[str, Any]:
    """The classic training and validation transforms, exactly as a torchvision script writes them."""
    import torchvision.transforms as T

    return {
        "train": T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]),
        "val": T.Compose([T.Resize(256), T.CenterCrop(SIZE), T.ToTensor(), T.Normalize(MEAN, STD)]),
    }


def dropin_datasets(files: list[Path], recipe: Any) -> tuple[Any, Any, list[int]]:
    """(torchvision's ImageFolder, fastpipe's, the indices of ``files``) over the class folders that hold ``files``."""
    import torchvision

    from fastpipe.datasets import ImageFolder

    root = files[0].parent.parent
    theirs, ours = torchvision.datasets.ImageFolder(root, transform=recipe), ImageFolder(root, transform=recipe)
    wanted = {str(f) for f in files}
    indices = [i for i, (path, _) in enumerate(theirs.samples) if path in wanted]
    if not indices:
        sys.exit(f"bench_jpeg --dropin: {root} is not a folder of class folders holding the files")
    return theirs, ours, indices


def dropin_agreement(theirs: Any, ours: Any, indices: list[int]) -> dict[str, Any]:
    """Same seed per item for both: the crop boxes each drew (torchvision's where it crops, fastpipe's where the op
    decodes) and the mean absolute pixel difference in 0..255 levels (undoing ToTensor and Normalize)."""
    import torchvision.transforms.functional as F

    import fastpipe.datasets.crop as crop_module

    boxes: dict[str, list[tuple[int, ...]]] = {"torchvision": [], "fastpipe": []}
    real_crop, real_decode = F.resized_crop, crop_module.jpeg_ops.decode_jpeg_crop

    def theirs_box(img: Any, top: int, left: int, height: int, width: int, *args: Any, **kwargs: Any) -> Any:
        boxes["torchvision"].append((top, left, height, width))
        return real_crop(img, top, left, height, width, *args, **kwargs)

    def ours_box(source: Any, box: Any, size: Any, hflip: bool = False) -> torch.Tensor:
        boxes["fastpipe"].append(tuple(box))
        return real_decode(source, box, size, hflip=hflip)

    std = torch.tensor(STD)[:, None, None]
    diffs = []
    F_module = sys.modules["torchvision.transforms.transforms"].F
    try:
        F_module.resized_crop, crop_module.jpeg_ops.decode_jpeg_crop = theirs_box, ours_box
        for i in indices:
            torch.manual_seed(i)
            a, _ = ours[i]
            torch.manual_seed(i)
            b, _ = theirs[i]
            diffs.append(((a - b).abs() * 255 * std).mean().item())
    finally:
        F_module.resized_crop, crop_module.jpeg_ops.decode_jpeg_crop = real_crop, real_decode
    drawn = len(boxes["torchvision"])
    same = sum(x == y for x, y in zip(boxes["torchvision"], boxes["fastpipe"])) if drawn == len(boxes["fastpipe"]) else 0
    return {
        "boxes_compared": drawn,
        "boxes_equal": same,
        "mean_abs_levels": statistics.mean(diffs),
        "max_image_mean_abs_levels": max(diffs),
        "within_tolerance": max(diffs) < DROPIN_TOLERANCE,
        "fast_path": str(ours.fast_path),
    }


def dropin_upscaled(files: list[Path], factor: int) -> tuple[list[Path], str]:
    """The files enlarged ``factor`` times (bicubic, JPEG quality 90) into two class folders, cached: photos the size
    of a camera's, where the validation resize can decode at a DCT scale (the corpus' own ~500 px photos cannot)."""
    from PIL import Image

    folder = Path.home() / ".cache" / "fastpipe" / f"bench-jpeg-dropin-{len(files)}-x{factor}"
    out = []
    for i, path in enumerate(files):
        target = folder / f"class_{i % 2}" / f"{i:05d}.jpg"
        out.append(target)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with Image.open(path) as im:
                rgb = im.convert("RGB")
                rgb.resize((rgb.width * factor, rgb.height * factor), Image.BICUBIC).save(target, quality=90)
    return out, f"{folder}: the files enlarged {factor}x (bicubic, quality 90)"


def dropin_main(files: list[Path], origin: str, rounds: int, out: Path, upscale: int = 1) -> int:
    """``--dropin``: per-image cost of torchvision's ImageFolder and fastpipe's, same transform, side by side in one run."""
    if upscale > 1:
        files, origin = dropin_upscaled(files, upscale)
    rows: dict[str, Row] = {}
    fns: dict[str, Callable[[], list[float]]] = {}
    agreement = {}
    for name, recipe in dropin_recipes().items():
        theirs, ours, indices = dropin_datasets(files, recipe)
        agreement[name] = dropin_agreement(theirs, ours, indices)
        for who, dataset in (("torchvision", theirs), ("fastpipe", ours)):
            key = f"{name}/{who}"
            rows[key] = Row(key, f"{type(dataset).__module__}.ImageFolder(root, transform={name} recipe)[i]", "thread CPU")
            fns[key] = over_files(lambda i, d=dataset: (torch.manual_seed(i), d[i]), indices, time.thread_time)  # type: ignore[arg-type]
    for fn in fns.values():  # warm-up: page cache, lazy imports
        fn()
    print(f"drop-in, {rounds} rounds over {len(files)} files, one thread (ms per image):")
    time_rounds(rows, fns, rounds, len(files))
    lines = [
        "# bench_jpeg --dropin: torchvision's ImageFolder against fastpipe's, the same transform",
        "",
        f"Corpus: {origin}. {fjpeg.jpeg_op_status()}. {rounds} rounds, shuffled order each round, thread CPU time, "
        "median of the rounds' mean cost per image (an item: dataset[i], file read to normalized float tensor).",
        "",
        "| recipe | torchvision ms/image | fastpipe ms/image | ratio (torchvision / fastpipe) | boxes equal | mean abs diff (levels) | worst image | within op tolerance (< 2.5) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    payload: dict[str, Any] = {"corpus": origin, "files": len(files), "rounds": rounds, "op": fjpeg.jpeg_op_status(), "recipes": {}}
    for name in dropin_recipes():
        tv, fp, agree = rows[f"{name}/torchvision"], rows[f"{name}/fastpipe"], agreement[name]
        ratio = tv.median_ms / fp.median_ms
        boxes = f"{agree['boxes_equal']}/{agree['boxes_compared']}" if agree["boxes_compared"] else "no random box"
        lines.append(
            f"| {name} | {tv.median_ms:.2f} | {fp.median_ms:.2f} | {ratio:.2f}x | {boxes} | {agree['mean_abs_levels']:.2f} | "
            f"{agree['max_image_mean_abs_levels']:.2f} | {'yes' if agree['within_tolerance'] else 'NO'} |"
        )
        payload["recipes"][name] = {"torchvision_ms": tv.median_ms, "fastpipe_ms": fp.median_ms, "ratio": ratio, **agree}
    lines += ["", *(f"- {name}: fastpipe's fast path: {agreement[name]['fast_path']}" for name in agreement), ""]
    text = "\n".join(lines)
    print()
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench_jpeg_dropin" if upscale == 1 else f"bench_jpeg_dropin_x{upscale}"
    (out / f"{stem}.md").write_text(text + "\n")
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    bad = [n for n, a in agreement.items() if not a["within_tolerance"] or a["boxes_equal"] != a["boxes_compared"]]
    if bad:
        print(f"bench_jpeg --dropin: FAILED agreement for {', '.join(bad)}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a folder of JPEGs (default: fastpipe.workloads.photos' corpus, built and cached on first use)")
    parser.add_argument("--n", type=int, default=300, help="files to use")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (each runs every candidate over every file)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the loader table (0: skip it)")
    parser.add_argument("--batch", type=int, default=32, help="DataLoader / DALI batch size")
    parser.add_argument("--threads", type=int, default=1, help="DALI's num_threads (fastpipe's comparison row is one thread)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for bench_jpeg.{json,md,png}")
    parser.add_argument(
        "--allow-missing", action="store_true", help="a target that could not be measured (e.g. DALI not installed) does not fail the run"
    )
    parser.add_argument("--dropin", action="store_true", help="only the ImageFolder drop-in table (torchvision's class vs fastpipe's)")
    parser.add_argument("--upscale", type=int, default=1, help="--dropin on the files enlarged this many times (camera-sized photos)")
    parser.add_argument(
        "--thread-loader", action="store_true", help="run only the thread-loader section (issue 25: benchmarks/thread_loaders.py)"
    )
    parser.add_argument("--no-memory", action="store_true", help="with --thread-loader: skip the PSS measurement")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()[0]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    files, origin = corpus_files(args.root, args.n)
    print(f"bench_jpeg: {len(files)} files from {origin}; {fjpeg.jpeg_op_status()}")
    if args.dropin:
        return dropin_main(files, origin, args.rounds, Path(args.out), args.upscale)
    if args.thread_loader:
        return thread_loader_run(files, origin, args)

    rows: dict[str, Row] = {}
    fns: dict[str, Callable[[], float]] = {}
    for name, (what, fn) in main_candidates().items():
        rows[name] = Row(name, what, "thread CPU")
        fns[name] = with_resize_kernel(RESIZE_KERNEL.get(name), over_files(fn, files, time.thread_time))
    # SPDL's FFmpeg may decode in threads of its own: wall time, compared with fastpipe-wall.
    for name, (what, fn, status), clock in (
        ("simplejpeg", simplejpeg_candidate(), "thread CPU"),
        ("spdl", spdl_candidate(), "wall"),
    ):
        rows[name] = Row(name, what, clock, status=status)
        if fn is not None:
            try:
                for path in files:  # a peer must decode every file to be timed on the same work
                    fn(path)
                fns[name] = over_files(fn, files, time.thread_time if clock == "thread CPU" else time.perf_counter)
            except Exception as exc:  # a peer that imports but cannot decode here, e.g. without FFmpeg's libraries
                rows[name].status = f"cannot run: {type(exc).__name__}: {str(exc)[:300]}"
    dali, status = dali_epoch(files, args.threads, args.batch)
    rows["dali-cpu"] = Row("dali-cpu", f"NVIDIA DALI CPU pipeline, {args.threads} thread(s), batch {args.batch}", "wall", status=status)
    if dali is not None:
        fns["dali-cpu"] = dali
    rows["fastpipe-wall"] = Row("fastpipe-wall", "fastpipe, one thread, wall time (DALI's comparison)", "wall")
    fns["fastpipe-wall"] = with_resize_kernel(
        RESIZE_KERNEL["fastpipe-wall"], over_files(main_candidates()["fastpipe"][1], files, time.perf_counter)
    )

    for fn in fns.values():  # warm-up: page cache, lazy imports, allocators
        fn()
    print(f"single thread, {args.rounds} rounds over {len(files)} files (ms per image):")
    per_file = time_rounds(rows, fns, args.rounds, len(files))
    groups = flavours(files)
    by_flavour, flavour_medians = flavour_table(per_file, groups, [r.name for r in rows.values() if r.clock == "thread CPU"])

    loader_rows: list[Row] = []
    loader_status = "not run: the loader table was skipped (--workers 0)"
    if args.workers > 0:
        cands = main_candidates()
        loader_fns = {}
        for name in ("pil-recipe", "torchvision-v2", "fastpipe"):
            loader_rows.append(Row(f"{name} ({args.workers} workers)", cands[name][0], "wall"))
            loader_fns[loader_rows[-1].name] = loader_epoch(files, cands[name][1], args.workers, args.batch)
        dali_workers, dali_status = dali_epoch(files, args.workers, args.batch)
        if dali_workers is not None:
            loader_rows.append(Row(f"dali-cpu ({args.workers} threads)", f"NVIDIA DALI CPU pipeline, num_threads={args.workers}", "wall"))
            loader_fns[loader_rows[-1].name] = dali_workers
        else:
            loader_status = dali_status
            print(f"dali-cpu ({args.workers} threads): {dali_status}")
        print(f"DataLoader, {args.workers} workers, batch {args.batch} (ms per image, wall):")
        time_rounds({r.name: r for r in loader_rows}, loader_fns, args.rounds, len(files))

    headers = header_costs(files)
    targets = issue_targets(rows, loader_rows, loader_status)
    ordered = list(rows.values())
    single = table(ordered, "fastpipe")
    lines = [
        "# bench_jpeg: JPEG file to a 224x224 RandomResizedCrop + flip sample",
        "",
        f"Corpus: {origin}. Machine: {platform.machine()}, {os.cpu_count()} cores, load average {load_before:.1f} before "
        f"and {os.getloadavg()[0]:.1f} after (other processes share it), {torch.get_num_threads()} torch thread, "
        f"python {platform.python_version()}, torch {torch.__version__}; {fjpeg.jpeg_op_status()}.",
        f"{args.rounds} rounds, candidates in a shuffled order each round; median of the rounds' mean cost per image.",
        "",
        *single,
        "",
    ]
    ratio = {r.name: r.median_ms / rows["fastpipe"].median_ms for r in ordered if r.status == "ok" and r.clock == "thread CPU"}
    for name in ("dali-cpu", "spdl"):
        if rows[name].status == "ok" and rows[name].clock == "wall":
            ratio[f"{name} (wall, vs fastpipe-wall)"] = rows[name].median_ms / rows["fastpipe-wall"].median_ms
    lines += ["Cost ratios to fastpipe, this run: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items() if k != "fastpipe"), ""]
    lines += resize_summary(rows)
    lines += ["By kind of file (same runs; thread CPU):", "", *by_flavour, ""]
    if loader_rows:
        lines += [
            f"DataLoader, {args.workers} worker processes, batch {args.batch}, wall time (DALI: its own pipeline with as many threads):",
            "",
            *loader_table(loader_rows),
            "",
        ]
    lines += ["Targets, as measured in this run:", "", "| target | measured | verdict |", "|---|---:|---|"]
    lines += [f"| {name} | {'' if value != value else f'{value:.2f}x'} | {verdict} |" for name, value, verdict in targets] + [""]
    lines += ["Header read, bytes in memory, best of 3 (us per file): " + ", ".join(f"{k} {v:.1f}" for k, v in headers.items()), ""]
    text = "\n".join(lines)
    print()
    print(text)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_jpeg.md").write_text(text + "\n")
    payload = {
        "corpus": origin,
        "files": len(files),
        "rounds": args.rounds,
        "op": fjpeg.jpeg_op_status(),
        "single_thread": [asdict(r) | {"median_ms": r.median_ms} for r in ordered],
        "ratios_to_fastpipe": ratio,
        "by_flavour_ms": flavour_medians,
        "flavour_counts": {g: len(idx) for g, idx in groups.items()},
        "loader": [asdict(r) | {"median_ms": r.median_ms} for r in loader_rows],
        "header_us": headers,
        "issue_targets": [{"target": t, "measured": v if v == v else None, "verdict": verdict} for t, v, verdict in targets],
    }
    (out / "bench_jpeg.json").write_text(json.dumps(payload, indent=2) + "\n")
    note = plot(ordered, out / "bench_jpeg.png")
    print(note or f"wrote {out / 'bench_jpeg.md'}, .json and .png")
    return exit_status(targets, args.allow_missing)


def thread_loader_run(files: list[Path], origin: str, args: argparse.Namespace) -> int:
    """The thread-loader section alone: its table and targets, written to bench_jpeg_threads.{md,json}."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from thread_loaders import thread_section

    lines, targets, payload = thread_section(files, args.rounds, args.batch, memory=not args.no_memory)
    lines += ["Targets, as measured in this run:", "", "| target | measured | verdict |", "|---|---:|---|"]
    lines += [f"| {name} | {'' if value != value else f'{value:.2f}x'} | {verdict} |" for name, value, verdict in targets]
    text = "\n".join([f"# bench_jpeg --thread-loader: {origin}; {fjpeg.jpeg_op_status()}", "", *lines])
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_jpeg_threads.md").write_text(text + "\n")
    (out / "bench_jpeg_threads.json").write_text(json.dumps({"corpus": origin, "files": len(files), **payload}, indent=2) + "\n")
    return exit_status(targets, args.allow_missing)


if __name__ == "__main__":
    sys.exit(main())
