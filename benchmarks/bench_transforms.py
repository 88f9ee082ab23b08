"""What the drop-in parts buy: per-op cost, per-sample worker cost, host-to-device bytes.

One table, measured in this process with one thread (``torch.set_num_threads(1)``), which is
what one DataLoader worker has. Every candidate of a group is timed once per round, in a
shuffled order, round after round, and the median per candidate is reported, so a change of
load on a shared machine hits naive and fast alike and the ratios stay honest. Times are CPU seconds of this
thread (``time.thread_time``), which other processes' load disturbs less than wall time.

Targets (issue 4), each printed as PASS or FAIL with the ratio measured in this run:

* numba and cpp RandomMask each >= 20x faster than the naive scipy RandomMask (256x256);
  the numba kernel also compiled for the x86-64 baseline (``NUMBA_CPU_NAME=generic``: SSE2
  only, as on a VM that hides newer instructions) in a subprocess, against the naive mask timed
  in that same subprocess (an earlier run saw 10x on one machine while this one measured 27x);
* the optimized workers' per-sample cost >= 10x lower than naive with the article's
  1024x1024 raw image (``toy:fast-raw``), and >= 20x lower with crop-first (``toy:optimized``);
* the host-to-device payload per batch 4x smaller (uint8 against float32).

A target that could not be measured (a backend not built, the baseline-ISA subprocess failing)
prints ``NOT MEASURED: <target>: <reason>`` and fails the run (exit 1) unless ``--allow-missing``.

Usage:
    python benchmarks/bench_transforms.py [--rounds 15] [--batch 32] [--json results.json] [--allow-missing]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from fastpipe._tree import tree_nbytes
from fastpipe.devices import parse_device
from fastpipe.ops import extension_status
from fastpipe.transforms import ConvertColorScale, RandomMask, backend_available, uniform_noise
from fastpipe.workloads.toy import FakeDataset, FastFakeDataset, naive_transform
from fastpipe.workloads.toy.naive import ConvertColor, Scale
from fastpipe.workloads.toy.naive import RandomMask as NaiveRandomMask
from fastpipe.workloads.toy.optimized import FAST_RAW, FAST_TRANSFORMS, OPTIMIZED, UINT8_HOST, Optimizations, optimized_transform
from fastpipe.workloads.toy.workloads import ARTICLE_BATCH_SIZE, make_workload

IMG = 256
RAW = 1024


@dataclass
class Row:
    section: str
    item: str
    value: float
    unit: str
    ratio: float | None = None  # naive / this (how many times cheaper or smaller)


def interleaved_medians(candidates: dict[str, Callable[[], Any]], rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median thread-CPU seconds per call of each candidate, timed in alternating rounds.

    The order is shuffled every round: whoever runs right after a cache-hungry candidate
    (the naive mask, a 3 MB raw image) starts with cold caches, and a fixed order would hand
    that penalty to the same candidate every time.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates)
    shuffler = random.Random(0)
    for _ in range(rounds):
        shuffler.shuffle(order)
        for name in order:
            start = time.thread_time()
            candidates[name]()
            samples[name].append(time.thread_time() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def mask_times(rounds: int) -> dict[str, float]:
    """Naive and numba RandomMask on one 256x256 uint8 sample: median thread-CPU seconds, interleaved."""
    sample = torch.randint(0, 256, (3, IMG, IMG), dtype=torch.uint8)
    numba_mask = RandomMask(0.25, backend="numba").warm_up()
    return interleaved_medians({"naive": lambda: NaiveRandomMask(0.25)(sample), "numba": lambda: numba_mask(sample)}, rounds * 20)


def baseline_isa_rows(rounds: int) -> tuple[list[Row], str | None]:
    """The numba mask compiled for x86-64's baseline ISA, timed with the naive mask in a subprocess.

    Numba compiles for the CPU it reports; for some targets (this baseline, Sandy Bridge, what a
    VM may present) LLVM once turned the mask's per-pixel select into a branch (3-8x slower).
    The subprocess gets its own Numba cache folder so the baseline build stays out of the package's.
    Returns the rows, and why they could not be measured (None when they were).
    """
    import subprocess
    import tempfile

    if not backend_available("numba"):
        return [], "the numba backend is not available (pip install numba)"
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=cache)
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--mask-times-only", "--rounds", str(rounds)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        except subprocess.TimeoutExpired:
            return [], "the baseline-ISA subprocess took over 600 s"
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no error output"]
        return [], f"the baseline-ISA subprocess exited {done.returncode}: {tail[0][:300]}"
    try:
        times = json.loads(done.stdout.strip().splitlines()[-1])
        naive, numba = float(times["naive"]), float(times["numba"])
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        return [], f"the baseline-ISA subprocess printed no timings ({type(exc).__name__}: {exc})"
    section = "per op, x86-64 baseline ISA (subprocess)"
    return [
        Row(section, "RandomMask naive (np.random.uniform + scipy)", naive * 1e3, "ms", 1.0),
        Row(section, "RandomMask numba, NUMBA_CPU_NAME=generic", numba * 1e3, "ms", naive / numba),
    ], None


def per_op_rows(rounds: int) -> list[Row]:
    """RandomMask per backend, colour + scale, raw generation: one 256x256 sample (raw: 1024x1024)."""
    sample = torch.randint(0, 256, (3, IMG, IMG), dtype=torch.uint8)
    masks: dict[str, Callable[[], Any]] = {"RandomMask naive (np.random.uniform + scipy)": lambda: NaiveRandomMask(0.25)(sample)}
    for backend in ("numpy", "numba", "cpp"):
        if backend_available(backend):
            transform = RandomMask(0.25, backend=backend).warm_up()
            masks[f"RandomMask {backend}"] = lambda t=transform: t(sample)
    mask_times = interleaved_medians(masks, rounds * 20)
    naive_mask = mask_times["RandomMask naive (np.random.uniform + scipy)"]
    rows = [Row("per op, one 256x256 sample", name, t * 1e3, "ms", naive_mask / t) for name, t in mask_times.items()]

    batch = torch.randint(0, 256, (32, 3, IMG, IMG), dtype=torch.uint8)
    fused = ConvertColorScale()
    colour = interleaved_medians(
        {
            "ConvertColor + Scale naive": lambda: Scale()(ConvertColor()(sample)),
            "ConvertColorScale, batch of 32 (CPU)": lambda: fused(batch),
        },
        rounds,
    )
    naive_colour = colour["ConvertColor + Scale naive"]
    rows.append(Row("per op, one 256x256 sample", "ConvertColor + Scale naive", naive_colour * 1e3, "ms", 1.0))
    per_sample = colour["ConvertColorScale, batch of 32 (CPU)"] / 32
    rows.append(
        Row(
            "per op, one 256x256 sample",
            "ConvertColorScale (per sample of a CPU batch; on GPU in practice)",
            per_sample * 1e3,
            "ms",
            naive_colour / per_sample,
        )
    )

    raw = interleaved_medians(
        {
            "raw 1024x1024: np.random.randint + PIL": lambda: Image.fromarray(np.random.randint(0, 256, (RAW, RAW, 3), dtype=np.uint8)),
            "raw 1024x1024: uniform_noise array": lambda: uniform_noise((RAW, RAW, 3)),
            "raw crop-first 256x256: uniform_noise array": lambda: uniform_noise((IMG, IMG, 3)),
        },
        rounds,
    )
    naive_raw = raw["raw 1024x1024: np.random.randint + PIL"]
    rows += [Row("per op, raw load", name, t * 1e3, "ms", naive_raw / t) for name, t in raw.items()]
    return rows


def _dataset(opts: Optimizations | None, length: int) -> FakeDataset:
    if opts is None:
        return FakeDataset(naive_transform(IMG), length=length, raw_size=(RAW, RAW))
    transform = optimized_transform(opts, IMG)
    for stage in transform.transforms:
        if isinstance(stage, RandomMask):
            stage.warm_up()
    if opts.fast_raw or opts.crop_first:
        return FastFakeDataset(transform, length=length, raw_size=(RAW, RAW), crop_size=IMG if opts.crop_first else None)
    return FakeDataset(transform, length=length, raw_size=(RAW, RAW))


def worker_rows(rounds: int, batch: int) -> list[Row]:
    """What one worker spends per sample: __getitem__ for a batch of samples plus collate, / batch."""
    variants = {
        "toy:naive": None,
        "toy:fast-transforms": FAST_TRANSFORMS,
        "toy:uint8-host (also toy:prefetch)": UINT8_HOST,
        "toy:fast-raw (1024x1024 raw)": FAST_RAW,
        "toy:optimized (crop-first)": OPTIMIZED,
    }
    datasets = {name: _dataset(opts, batch) for name, opts in variants.items()}

    def make_batch(dataset: FakeDataset) -> Any:
        return default_collate([dataset[i] for i in range(batch)])

    times = interleaved_medians({name: (lambda d=d: make_batch(d)) for name, d in datasets.items()}, rounds, warmup=1)
    naive = times["toy:naive"] / batch
    return [
        Row(f"per-sample worker cost (batch of {batch}, incl. collate)", name, t / batch * 1e3, "ms", naive / (t / batch))
        for name, t in times.items()
    ]


def h2d_rows() -> list[Row]:
    """Bytes of one real batch (the article's 256) from each variant's own DataLoader."""
    device = parse_device("sim:1")
    rows = []
    naive_bytes = None
    for variant in ("naive", "optimized"):
        workload = make_workload(variant, device, num_workers=0, length=ARTICLE_BATCH_SIZE)
        images, labels = next(iter(workload.loader))
        nbytes = tree_nbytes((images, labels))
        naive_bytes = naive_bytes or nbytes
        rows.append(
            Row(
                f"host-to-device payload per batch of {ARTICLE_BATCH_SIZE}",
                f"toy:{variant} ({images.dtype}, labels {labels.dtype})",
                nbytes / 2**20,
                "MiB",
                naive_bytes / nbytes,
            )
        )
    return rows


def print_table(rows: list[Row]) -> None:
    width = max(len(r.item) for r in rows)
    section = None
    print(f"{'item':<{width}}  {'median':>10}  {'unit':<4}  {'naive / this':>12}")
    for row in rows:
        if row.section != section:
            section = row.section
            print(f"-- {section}")
        ratio = "" if row.ratio is None else f"{row.ratio:.1f}x"
        print(f"{row.item:<{width}}  {row.value:>10.4f}  {row.unit:<4}  {ratio:>12}")


def targets(rows: list[Row]) -> list[tuple[str, float, float, bool]]:
    """(label, measured ratio, target ratio, met) for each target; a ratio of nan is a target not measured."""

    def ratio(section: str, item: str) -> float:
        found = [row.ratio for row in rows if row.section.startswith(section) and row.item.startswith(item)]
        return found[0] if found and found[0] is not None else float("nan")

    checks = [
        (f"RandomMask {backend} >= 20x faster than naive (256x256)", ratio("per op, one", f"RandomMask {backend}"), 20.0)
        for backend in ("numba", "cpp")
    ]
    checks.append((BASELINE_ISA_TARGET, ratio("per op, x86-64 baseline", "RandomMask numba"), 20.0))
    checks.append(("worker cost >= 10x lower, 1024x1024 raw (toy:fast-raw)", ratio("per-sample worker", "toy:fast-raw"), 10.0))
    checks.append(("worker cost >= 20x lower, crop-first (toy:optimized)", ratio("per-sample worker", "toy:optimized"), 20.0))
    # float32 -> uint8 images are exactly 4x; the int64 labels (2 KiB of 48 MiB) keep the whole batch a hair under
    # A property of the batch, not a timing: it fails only if toy:optimized stops shipping uint8.
    checks.append(
        (
            "H2D payload per batch ~4x smaller (uint8 vs float32; a property check, not a timing)",
            ratio("host-to-device", "toy:optimized"),
            3.99,
        )
    )
    return [(label, value, goal, bool(value >= goal)) for label, value, goal in checks]


BASELINE_ISA_TARGET = "RandomMask numba >= 20x faster than naive, compiled for the x86-64 baseline ISA"


def why_not_measured(label: str, unmeasured: dict[str, str]) -> str:
    """Why a target has no measured ratio: the reason recorded for it, else what its label needs."""
    if label in unmeasured:
        return unmeasured[label]
    for backend in ("numba", "cpp"):
        if f"RandomMask {backend} " in label:
            return f"the {backend} backend is not available ({extension_status()})"
    return "its rows are missing from this run"


def verdicts(results: list[tuple[str, float, float, bool]], unmeasured: dict[str, str], allow_missing: bool) -> int:
    """Print PASS, FAIL or NOT MEASURED for each target; the exit status (a target not measured fails unless allowed)."""
    missing = 0
    for label, value, goal, ok in results:
        if value != value:  # nan: not measured
            missing += 1
            print(f"NOT MEASURED: {label}: {why_not_measured(label, unmeasured)}")
        else:
            print(f"{'PASS' if ok else 'FAIL'}  {label}: {value:.1f}x (target {goal:g}x)")
    if missing and allow_missing:
        print(f"{missing} target(s) not measured; --allow-missing: they do not decide the exit status")
    failed = any(ok is False and value == value for _, value, _, ok in results)
    return 1 if failed or (missing and not allow_missing) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per group (RandomMask gets 20x as many)")
    parser.add_argument("--batch", type=int, default=32, help="samples per timed batch in the worker-cost group")
    parser.add_argument("--json", help="also write the rows and targets to this file")
    parser.add_argument(
        "--allow-missing", action="store_true", help="a target that could not be measured (NOT MEASURED) does not fail the run"
    )
    parser.add_argument("--mask-times-only", action="store_true", help=argparse.SUPPRESS)  # baseline_isa_rows' subprocess
    args = parser.parse_args(argv)
    if args.mask_times_only:
        torch.set_num_threads(1)
        print(json.dumps(mask_times(args.rounds)))
        return 0

    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    load = os.getloadavg()
    print(f"bench_transforms: 1 thread, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    print(f"torch {torch.__version__}; {extension_status()}; times are median thread-CPU ms")
    began = time.perf_counter()
    isa_rows, isa_missing = baseline_isa_rows(args.rounds)
    unmeasured = {BASELINE_ISA_TARGET: isa_missing} if isa_missing else {}
    rows = per_op_rows(args.rounds) + isa_rows + worker_rows(args.rounds, args.batch) + h2d_rows()
    print_table(rows)
    results = targets(rows)
    print("-- targets (ratios from this run)")
    status = verdicts(results, unmeasured, args.allow_missing)
    load = os.getloadavg()
    print(f"took {time.perf_counter() - began:.0f} s; load average {load[0]:.2f} at the end (a shared machine: other processes compete)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "rows": [asdict(r) for r in rows],
                    "targets": [
                        dict(
                            label=label,
                            ratio=v if v == v else None,
                            target=g,
                            ok=o if v == v else None,
                            not_measured=None if v == v else why_not_measured(label, unmeasured),
                        )
                        for label, v, g, o in results
                    ],
                },
                fh,
                indent=2,
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
