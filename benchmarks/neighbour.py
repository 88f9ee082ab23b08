"""Issue 32's must-show: each case diagnosed beside a controlled neighbour and without one, several runs each.

    .venv/bin/python benchmarks/neighbour.py [--runs 3] [--neighbours none,training,busy] [--cases ...] [--small]

The neighbours (``benchmarks/neighbour_job.py``): ``training``, another training job with its own 2 DataLoader
workers; ``busy``, two pure-CPU busy loops; ``none``, nothing started (whatever else runs on the machine still
runs: the load average is printed with every run). The cases:

* ``free-raw``: a raw load that costs nothing (a random uint8 image, ~0.2 ms of CPU) and an 8 ms transform (CPU
  burnt on the thread's clock, so its cost does not change beside a neighbour; only its wall time stretches), then
  a free transform; ``free-raw-sampler``: the same with a custom batch sampler.
* ``sleep-raw``: a raw load that sleeps 12 ms and a free transform: the stage that really waits.
* ``preset``: torchvision's reference training preset, in its style (``ClassificationPresetTrain``: a class holding
  a Compose of RandomResizedCrop, RandomHorizontalFlip, PILToTensor, ConvertImageDtype, Normalize), over an
  ImageFolder of real-photo JPEGs (:mod:`fastpipe.workloads.photos`, read once first so they sit in the page cache),
  decoded by PIL: all CPU.
* ``toy``: ``toy:naive`` (``--small``: batch 32 of 512x512 images; else the article's sizes).

For each run it prints what is named (stage, figure, basis, waits or computes), the in-worker table (wall, CPU,
run queue, held by other threads, own waits with their noise, and the worker-overhead row), each stage's context
switches, and the busy-machine caveat; then, per case, the checks: the planted stage named first, no free stage
named (not even as a small cost), no CPU stage called waiting, the sleeping stage called waiting, and toy:naive's (and
the preset's) culprits (named stages less the small costs, rule 7 of ``_attribute``) inside the workers in the same
order with and without a neighbour (the loop's own parts, collate/IPC and the
host-to-device copy, are ladder figures of a few ms here, named or not by noise, and are left out of that check). Exits 1 when a check fails. Timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset, Sampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import neighbour_job  # noqa: E402

from fastpipe import DiagnoseOptions, diagnose  # noqa: E402
from fastpipe.workloads._workload import load_workload  # noqa: E402

BATCH, WORKERS = 8, 2
LOOP_PARTS = ("collate/IPC", "host-to-device copy")
"""The loop's own parts, outside the workers: measured by the ladder alone, small here, and named or not by noise."""


def burn(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


class Burn:
    """A transform that costs ``ms`` of the thread's CPU, whatever else runs on the machine."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        burn(self.ms)
        return x


class Free:
    def __call__(self, x: Any) -> Any:
        return x


class RandomImages(Dataset):
    """A random uint8 image per sample (the raw load: ~0.2 ms of CPU at the default side), or a sleep first with
    ``sleep_ms``. (``tests/diagnosis/verdict/test_attribute_neighbour.py`` plants its pipelines with these classes too.)"""

    def __init__(self, transform: Any, sleep_ms: float = 0.0, side: int = 64) -> None:
        self.transform, self.sleep_ms, self.side = transform, sleep_ms, side

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> Any:
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000)
        return self.transform(torch.randint(0, 256, (3, self.side, self.side), dtype=torch.uint8)), index % 10


class Batches(Sampler):
    """A custom batch sampler: batches of BATCH consecutive indices."""

    def __len__(self) -> int:
        return 1 << 16

    def __iter__(self) -> Any:
        for start in range(0, len(self) * BATCH, BATCH):
            yield list(range(start, start + BATCH))


class ClassificationPresetTrain:
    """torchvision's reference training preset, in its style (references/classification/presets.py): PIL backend."""

    def __init__(
        self,
        *,
        crop_size: int = 176,
        mean: tuple[float, ...] = (0.485, 0.456, 0.406),
        std: tuple[float, ...] = (0.229, 0.224, 0.225),
        hflip_prob: float = 0.5,
    ) -> None:
        trans: list[Any] = [T.RandomResizedCrop(crop_size, antialias=True)]
        if hflip_prob > 0:
            trans.append(T.RandomHorizontalFlip(hflip_prob))
        trans += [T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(mean=mean, std=std)]
        self.transforms = T.Compose(trans)

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


@dataclass
class Case:
    name: str
    build: Callable[[], Any]
    """A (loader, step) pair or a Workload."""
    device: str
    planted: str | None
    """The stage that must be named first (None: compare the named order with the quiet runs)."""
    free: tuple[str, ...] = ()
    waits: tuple[str, ...] = ()
    """Stages that must be called waiting when named; every other CPU stage must not be."""
    named: dict[str, list[list[str]]] = field(default_factory=dict)


def _photos(n: int) -> Any:
    from torchvision.datasets import ImageFolder

    from fastpipe.workloads.photos import build_corpus

    root = build_corpus(n=n, classes=4)
    for path in root.rglob("*.jpg"):  # into the page cache: the raw load is decode, not the disk
        path.read_bytes()
    return ImageFolder(str(root), transform=ClassificationPresetTrain())


def cases(small: bool) -> list[Case]:
    planted = lambda: T.Compose([Burn(8.0), Free()])  # noqa: E731
    toy_options = dict(batch_size=32, raw_size=512, img_size=224) if small else {}
    return [
        Case("free-raw", lambda: DataLoader(RandomImages(planted()), batch_size=BATCH, num_workers=WORKERS), "sim:10", "Burn", ("Free",)),
        Case(
            "free-raw-sampler",
            lambda: DataLoader(RandomImages(planted()), batch_sampler=Batches(), num_workers=WORKERS),
            "sim:10",
            "Burn",
            ("Free",),
        ),
        Case(
            "sleep-raw",
            lambda: DataLoader(RandomImages(T.Compose([Free()]), sleep_ms=12.0), batch_size=BATCH, num_workers=WORKERS),
            "sim:10",
            "raw load",
            ("Free",),
            waits=("raw load",),
        ),
        Case(
            "preset",
            lambda: DataLoader(_photos(200 if small else 1000), batch_size=BATCH, num_workers=WORKERS),
            "sim:10",
            None,
        ),
        Case("toy", lambda: load_workload("toy:naive", "sim:290", num_workers=WORKERS, **toy_options), "sim:290", None),
    ]


def run_one(case: Case, steps: int, budget: float) -> Any:
    source = case.build()
    step = None if not isinstance(source, DataLoader) else (lambda batch: None)
    options = DiagnoseOptions(steps=steps, warmup=2, budget=budget, progress=False, loader_memory=False, startup=False)
    return diagnose(source, step, device=case.device, options=options)


def show(report: Any) -> list[str]:
    named = [b.stage for b in report.bottlenecks if not b.minor]
    for b in report.bottlenecks:
        how = "" if b.waits is None else (" waits" if b.waits else " computes")
        small = ", a small cost" if b.minor else ""
        print(f"    named: {b.stage}: {b.added_ms:.1f} ms/step ±{b.noise_ms:.1f} ({b.basis}{small}){how}")
    if not named:
        print(f"    named: nothing ({report.verdict})")
    for line in report.stage_cost_lines or []:
        print(f"    | {line}")
    for s in (report.stage_costs or {}).get("stages", []):
        print(f"    | {s['name']}: {s['voluntary_switches']:.2f} voluntary, {s['involuntary_switches']:.2f} involuntary switches a sample")
    for caveat in report.caveats:
        if "other processes" in caveat:
            print(f"    caveat: {caveat}")
    for b in report.bottlenecks:
        if b.waits and b.recommendation:
            print(f"    advice: {b.recommendation}")
    return named


def check(ok: bool, text: str) -> bool:
    print(f"  [{'PASS' if ok else 'FAIL'}] {text}")
    return ok


def judge(case: Case, reports: dict[str, list[Any]]) -> bool:
    ok = True
    quiet = [n for n in case.named.get("none", [])]
    for neighbour, runs in case.named.items():
        for i, named in enumerate(runs):
            report = reports[neighbour][i]
            where = f"{case.name}, {neighbour} neighbour, run {i + 1}"
            if case.planted is not None:
                ok &= check(bool(named) and named[0] == case.planted, f"{where}: named first {named[:1]}, planted {case.planted}")
                every = [b.stage for b in report.bottlenecks]  # a free stage is not even a small cost
                ok &= check(not set(every) & set(case.free), f"{where}: no free stage named ({every})")
            elif quiet and neighbour != "none":
                inside = [n for n in named if n not in LOOP_PARTS]
                expected = [[n for n in q if n not in LOOP_PARTS] for q in quiet]
                ok &= check(inside in expected, f"{where}: named {named}; quiet runs named {quiet} (loop parts aside)")
            for b in report.bottlenecks:
                if b.waits and b.stage not in case.waits:
                    ok &= check(False, f"{where}: {b.stage} is CPU work and was called waiting")
                if b.stage in case.waits:
                    ok &= check(bool(b.waits), f"{where}: {b.stage} sleeps and is called {'waiting' if b.waits else 'computing'}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--neighbours", default="none,training,busy")
    parser.add_argument("--cases", default="free-raw,free-raw-sampler,sleep-raw,preset,toy")
    parser.add_argument("--small", action="store_true", help="toy:naive at batch 32 of 512x512, 200 photos")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per ladder point")
    args = parser.parse_args()
    chosen = args.cases.split(",")
    neighbours = args.neighbours.split(",")
    ok = True
    print(f"{os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    for case in [c for c in cases(args.small) if c.name in chosen]:
        reports: dict[str, list[Any]] = {}
        for neighbour in neighbours:
            proc = None if neighbour == "none" else neighbour_job.start(neighbour)
            try:
                for run in range(args.runs):
                    started = time.perf_counter()
                    report = run_one(case, args.steps, args.budget)
                    print(
                        f"\n== {case.name}, neighbour {neighbour}, run {run + 1}: {time.perf_counter() - started:.0f} s, "
                        f"load average {os.getloadavg()[0]:.2f}"
                    )
                    case.named.setdefault(neighbour, []).append(show(report))
                    reports.setdefault(neighbour, []).append(report)
            finally:
                if proc is not None:
                    neighbour_job.stop(proc)
        print(f"\n-- {case.name}: checks")
        ok &= judge(case, reports)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
