"""Fuzz fastpipe's JPEG readers with damaged photos, in a child process, and print the tally.

Seeded mutations of real-photo JPEGs (truncations, bit flips, zeroed or garbage spans, frame
sizes set to 0 or 65500 in the SOF marker, garbage after the SOI marker, empty input,
non-JPEG bytes) and of crop requests (random, whole-image, out-of-range and huge boxes, huge
outputs) go through ``jpeg_size``, ``decode_jpeg_crop``, the entropy floor op
(``jpeg_entropy_floor``) and ``fastpipe.datasets.ImageFolder`` (``on_error="raise"`` and
``"pil"``), and the raw op ``torch.ops.fastpipe.decode_jpeg_crop`` on the bytes (whose own
checks must hold without the Python ones). A case is one call. Each must return a
correct-shaped result (and no image for a box outside the size the JPEG header states) or raise ``CorruptImageError`` / ``ConfigError`` whose message names
the file (the raw op: a ``RuntimeError`` from its checks or from libjpeg).

The calls run in a child process that reports each case as it starts and ends, so a crash
(a signal, e.g. SIGSEGV) or a hang is seen and counted against the case that caused it; the
parent then starts a new child after that case. Usage::

    python benchmarks/fuzz_jpeg.py --cases 2000 --seed 1            # builds a small corpus in ~/.cache
    python benchmarks/fuzz_jpeg.py --corpus DIR --cases 500

Exits 1 if any case crashed, hung, or ended in another exception or a wrong shape.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGETS = ("jpeg_size", "decode_jpeg_crop", "decode_jpeg_crop_op", "entropy_floor", "ImageFolder", "ImageFolder:pil")
#: Seconds a single case may take before the child is killed and the case counted as a hang.
CASE_TIMEOUT_S = 30.0


class Case:
    """One call: ``target`` on the mutated ``file`` with the crop ``box`` (top, left, height, width) and output ``size``."""

    FIELDS = ("index", "mutation", "target", "file", "box", "size", "bottom")

    def __init__(self, index: int, mutation: str, target: str, file: str, box: list[int], size: list[int], bottom: int) -> None:
        self.index, self.mutation, self.target, self.file = index, mutation, target, file
        self.box, self.size, self.bottom = box, size, bottom  # bottom: the entropy floor's row

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}


class Tally:
    """What the cases did; ``other`` counts other exceptions, errors not naming the file and wrong shapes."""

    def __init__(self) -> None:
        self.cases = self.images = self.clear_errors = self.crashes = self.hangs = self.other = 0
        self.failures: list[str] = []

    @property
    def ok(self) -> bool:
        return self.crashes == 0 and self.hangs == 0 and self.other == 0

    def line(self) -> str:
        return (
            f"cases {self.cases}, images {self.images}, clear errors {self.clear_errors}, crashes {self.crashes}, "
            f"hangs {self.hangs}, other exceptions {self.other}"
        )


# --------------------------------------------------------------------------------------------
# Mutations: bytes in, bytes out, all drawn from `rng`.


def sof_offset(data: bytes) -> int | None:
    """Offset of the first start-of-frame marker (its 0xFF) when its size fields are all in ``data``."""
    from fastpipe.ops.jpeg import sof_offset as first_sof  # the op's own marker walk

    pos = first_sof(data)
    return pos if pos is not None and pos + 9 <= len(data) else None


def set_frame_size(data: bytes, height: int | None, width: int | None) -> bytes:
    pos = sof_offset(data)
    if pos is None:
        return data
    out = bytearray(data)
    if height is not None:
        out[pos + 5 : pos + 7] = height.to_bytes(2, "big")
    if width is not None:
        out[pos + 7 : pos + 9] = width.to_bytes(2, "big")
    return bytes(out)


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(
        [
            "intact",
            "truncate",
            "truncate-header",
            "bitflip",
            "bitflip-header",
            "zero-span",
            "garbage-span",
            "frame-0",
            "frame-65500",
            "garbage-after-soi",
            "empty",
            "not-jpeg",
            "soi-only",
        ]
    )
    n = len(data)
    if kind == "intact":
        return kind, data
    if kind == "truncate":
        return kind, data[: rng.randrange(2, n)]
    if kind == "truncate-header":
        return kind, data[: rng.randrange(0, min(n, 700))]
    if kind in ("bitflip", "bitflip-header"):
        out = bytearray(data)
        hi = min(n, 1024) if kind == "bitflip-header" else n
        for _ in range(rng.randint(1, 24)):
            out[rng.randrange(hi)] ^= 1 << rng.randrange(8)
        return kind, bytes(out)
    if kind in ("zero-span", "garbage-span"):
        out = bytearray(data)
        start = rng.randrange(n)
        length = rng.randint(1, max(1, n // 4))
        span = bytes(length) if kind == "zero-span" else bytes(rng.getrandbits(8) for _ in range(length))
        out[start : start + length] = span[: n - start]
        return kind, bytes(out)
    if kind == "frame-0":
        which = rng.choice(["h", "w", "both"])
        return kind, set_frame_size(data, 0 if which != "w" else None, 0 if which != "h" else None)
    if kind == "frame-65500":
        which = rng.choice(["h", "w", "both"])
        return kind, set_frame_size(data, 65500 if which != "w" else None, 65500 if which != "h" else None)
    if kind == "garbage-after-soi":
        garbage = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
        return kind, b"\xff\xd8" + garbage + (data[2:] if rng.random() < 0.5 else b"")
    if kind == "empty":
        return kind, b""
    if kind == "soi-only":
        return kind, rng.choice([b"\xff\xd8", b"\xff\xd8\xff", b"\xff\xd8\xff\xd9", b"\xff\xd8\xff\xc0\x00\x11"])
    garbage = rng.choice([b"this is not an image", b"\x89PNG\r\n\x1a\n" + bytes(40), bytes(rng.getrandbits(8) for _ in range(200))])
    return "not-jpeg", garbage


def draw_request(height: int, width: int, rng: random.Random) -> tuple[str, list[int], list[int]]:
    """A (kind, box, size) crop request for an image that was (before mutation) height x width."""
    size = [rng.randint(1, 48), rng.randint(1, 48)]
    kind = rng.choice(["random", "random", "random", "whole", "out-of-range", "huge", "huge-output"])
    if kind == "whole":
        return kind, [0, 0, height, width], size
    if kind == "out-of-range":
        box = rng.choice(
            [
                [height, 0, 1, 1],
                [0, width, 1, 1],
                [0, 0, height + 1, width],
                [height - 1, width - 1, 2, 2],
                [-1, 0, 10, 10],
                [0, 0, 0, 10],
                [0, 0, 10, -5],
            ]
        )
        return kind, box, size
    if kind == "huge":
        big = rng.choice([2**31, 2**62, 2**63 - 1, 2**64, 65500])
        box = rng.choice([[big, 0, big, 10], [0, big, 10, big], [0, 0, big, big], [1, 1, 2**63 - 2, 10], [big, big, 1, 1]])
        return kind, box, size
    if kind == "huge-output":
        size = rng.choice([[65535, 1], [1, 65535], [4096, 4096], [65536, 8], [0, 8], [70000, 70000]])
    top, left = rng.randrange(height), rng.randrange(width)
    return kind, [top, left, rng.randint(1, height - top), rng.randint(1, width - left)], size


def make_cases(corpus: Path, workdir: Path, count: int, seed: int) -> list[Case]:
    """Write `count` mutated files under workdir/files/class_0 (ImageFolder's layout) and return their cases."""
    from PIL import Image

    sources = sorted(corpus.rglob("*.jpg"))
    if not sources:
        raise SystemExit(f"no .jpg files under {corpus}")
    originals = []
    for path in sources:
        with Image.open(path) as im:
            originals.append((path.read_bytes(), im.size[1], im.size[0]))
    folder = workdir / "files" / "class_0"
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        data, height, width = originals[rng.randrange(len(originals))]
        mutation, mutated = mutate(data, rng)
        request, box, size = draw_request(height, width, rng)
        target = TARGETS[i % len(TARGETS)]
        path = folder / f"case_{i:06d}.jpg"
        path.write_bytes(mutated)
        cases.append(Case(i, f"{mutation}/{request}", target, str(path), box, size, rng.randint(0, height + 20)))
    return cases


# --------------------------------------------------------------------------------------------
# The child: runs cases, one line per case on stdout.


def outside_header(case: Case) -> str | None:
    """Why the case's box lies outside the size its JPEG header states, or None (inside, or no size to read)."""
    from fastpipe.ops import jpeg

    data = Path(case.file).read_bytes()
    size = jpeg._jpeg_header_size(data) if data[:3] == b"\xff\xd8\xff" else None
    if not size or 0 in size:
        return None
    top, left, height, width = case.box
    if min(top, left) >= 0 and min(height, width) > 0 and top + height <= size[0] and left + width <= size[1]:
        return None
    return f"box {case.box} is outside the {size[0]}x{size[1]} image its header states"


def run_case(case: Case, folders: dict[str, Any]) -> tuple[str, str]:
    """('image' | 'clear' | 'other', detail) for one case, in this process."""
    import torch

    from fastpipe.errors import ConfigError, CorruptImageError
    from fastpipe.ops import jpeg

    if case.target == "crash" and os.environ.get("FASTPIPE_FUZZ_SELFTEST") == "1":  # the test that the parent sees crashes
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    try:
        if case.target == "jpeg_size":
            h, w = jpeg.jpeg_size(case.file)
            good = isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0
            return ("image", "") if good else ("other", f"jpeg_size returned {(h, w)}")
        if case.target == "decode_jpeg_crop":
            out = jpeg.decode_jpeg_crop(case.file, tuple(case.box), tuple(case.size), hflip=case.index % 2 == 0)
            good = out.dtype == torch.uint8 and tuple(out.shape) == (3, *case.size)
            if good and outside_header(case):
                return "other", f"decode_jpeg_crop returned an image, but the {outside_header(case)}"
            return ("image", "") if good else ("other", f"decode_jpeg_crop returned {out.dtype} {tuple(out.shape)}")
        if case.target == "decode_jpeg_crop_op":
            data = jpeg.read_bytes(case.file)
            box = [min(v, 2**63 - 1) for v in case.box]  # what an int64 argument can hold
            try:
                out = torch.ops.fastpipe.decode_jpeg_crop(data, *box, *case.size, False, jpeg.max_image_pixels())
            except RuntimeError as exc:
                message = str(exc)
                known = message.startswith(("decode_jpeg_crop:", "cannot decode the JPEG"))
                return ("clear", "") if known else ("other", f"RuntimeError without the op's prefix: {message[:300]}")
            good = out.dtype == torch.uint8 and tuple(out.shape) == (3, *case.size)
            if good and outside_header(case):
                return "other", f"the op returned an image, but the {outside_header(case)}"
            return ("image", "") if good else ("other", f"the op returned {out.dtype} {tuple(out.shape)}")
        if case.target == "entropy_floor":
            rows = jpeg.jpeg_entropy_floor(case.file, case.bottom)
            good = isinstance(rows, int) and 0 <= rows
            return ("image", "") if good else ("other", f"jpeg_entropy_floor returned {rows!r}")
        dataset = folders[case.target]
        torch.manual_seed(case.index)  # ImageFolder draws its box and flip from torch's RNG: the same case, the same draw
        image, label = dataset[case.index]
        good = image.dtype == torch.uint8 and tuple(image.shape) == (3, *dataset.decode.size) and label == 0
        return ("image", "") if good else ("other", f"{case.target} returned {image.dtype} {tuple(image.shape)}, label {label}")
    except (CorruptImageError, ConfigError) as exc:
        if case.file in str(exc):
            return "clear", ""
        return "other", f"{type(exc).__name__} not naming the file: {exc}"
    except Exception as exc:  # anything else is a finding: report it, never hide it
        return "other", f"{type(exc).__name__}: {exc}"


def child(workdir: Path, start: int) -> None:
    import warnings

    import torch

    from fastpipe.datasets import ImageFolder
    from fastpipe.ops import jpeg

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # PIL's and libjpeg's complaints about damaged files are expected here
    cases = [Case(**c) for c in json.loads((workdir / "cases.json").read_text())]
    root = workdir / "files"
    folders = {"ImageFolder": ImageFolder(root, size=24), "ImageFolder:pil": ImageFolder(root, size=24, on_error="pil")}
    assert [s[0] for s in folders["ImageFolder"].samples] == [c.file for c in cases], "ImageFolder's order must be the cases'"
    print(f"READY {jpeg.jpeg_op_status()}", flush=True)
    for case in cases[start:]:
        print(f"START {case.index}", flush=True)
        outcome, detail = run_case(case, folders)
        print(f"END {case.index} {outcome} {json.dumps(detail)}", flush=True)


# --------------------------------------------------------------------------------------------
# The parent: starts children, reads their lines, counts.


def run(
    corpus: "str | os.PathLike[str]",
    cases: int = 500,
    seed: int = 0,
    workdir: "str | os.PathLike[str] | None" = None,
    verbose: bool = False,
) -> Tally:
    """Fuzz `cases` calls built from the JPEGs under `corpus`; returns the tally (crashes are counted, not raised)."""
    with tempfile.TemporaryDirectory(prefix="fastpipe-fuzz-") as tmp:
        work = Path(workdir) if workdir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        all_cases = make_cases(Path(corpus), work, cases, seed)
        (work / "cases.json").write_text(json.dumps([c.as_dict() for c in all_cases]))
        tally = Tally()
        start = 0
        while start < len(all_cases):
            start = _run_child(work, start, all_cases, tally, verbose)
        return tally


def _fail(tally: Tally, case: Case, what: str) -> None:
    tally.failures.append(f"case {case.index} ({case.target}, {case.mutation}, box {case.box}, size {case.size}, {case.file}): {what}")


def _run_child(work: Path, start: int, cases: list[Case], tally: Tally, verbose: bool) -> int:
    """Run cases from `start` in one child; returns where the next child must start."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(work), "--start", str(start)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import selectors

    current: int | None = None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
    deadline = time.monotonic() + 120.0  # the first line comes after imports
    while True:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            proc.kill()
            proc.wait()
            if current is None:
                raise RuntimeError(f"the fuzz child did not start: {proc.stderr.read()}")  # type: ignore[union-attr]
            tally.cases += 1
            tally.hangs += 1
            _fail(tally, cases[current], f"no answer in {CASE_TIMEOUT_S:.0f} s (hang)")
            return current + 1
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        word, _, rest = line.rstrip("\n").partition(" ")
        if word == "READY":
            if verbose:
                print(f"child from case {start}: {rest}", flush=True)
        elif word == "START":
            current = int(rest)
            deadline = time.monotonic() + CASE_TIMEOUT_S
        elif word == "END":
            index, outcome, detail = rest.split(" ", 2)
            case = cases[int(index)]
            tally.cases += 1
            if outcome == "image":
                tally.images += 1
            elif outcome == "clear":
                tally.clear_errors += 1
            else:
                tally.other += 1
                _fail(tally, case, json.loads(detail))
            current = None
    code = proc.wait()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    if current is not None:  # died inside a case: a crash
        tally.cases += 1
        tally.crashes += 1
        reason = f"signal {-code}" if code < 0 else f"exit code {code}"
        _fail(tally, cases[current], f"the process died ({reason}) {stderr.strip()[-300:]}")
        return current + 1
    if code != 0:
        raise RuntimeError(f"the fuzz child failed outside any case (exit code {code}): {stderr.strip()[-2000:]}")
    return len(cases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", help="folder of JPEGs to mutate (default: build a 12-photo corpus)")
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child), args.start)
        return 0
    corpus = args.corpus
    if corpus is None:
        try:
            from fastpipe.workloads.photos import build_corpus
        except ImportError:  # before the modules moved into subpackages
            from fastpipe.photos import build_corpus  # type: ignore[no-redef]
        corpus = build_corpus(n=12, seed=args.seed, classes=2)
    began = time.perf_counter()
    tally = run(corpus, args.cases, args.seed, verbose=True)
    for failure in tally.failures:
        print("FAIL", failure)
    print(f"fuzz_jpeg (seed {args.seed}): {tally.line()} in {time.perf_counter() - began:.1f} s")
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
