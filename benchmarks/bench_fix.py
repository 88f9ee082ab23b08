"""``fastpipe fix`` on the two pipelines of issue 30: a torchvision reference-style preset and timm's create_loader.

Each pipeline reads the real-photo corpus (:func:`fastpipe.workloads.photos.build_corpus`, ImageNet's sizes) at a
simulated step short enough that it is input-bound (``--device``, default sim:20, the issue's 20 ms step), and
:func:`fastpipe.experiments.fix` builds its candidate fixes, checks each one's input against the original and measures
them all with the original in one run (rotated rounds, pooled, noise checked). The script prints the fix report (the
measured fixes ranked by gain, with their input checks; those tried and not helping; advice not tried), then the
first fix's throughput against the original's from that same run, and the seconds the fix engine took.

* ``torchvision``: ``torchvision.datasets.ImageFolder(root, PresetTrain(224))``, where ``PresetTrain`` is written
  as torchvision's ``references/classification/presets.py`` writes ``ClassificationPresetTrain`` (defaults: PIL
  backend, bilinear RandomResizedCrop, flip 0.5, PILToTensor, ConvertImageDtype(float), Normalize), stages held in
  ``self.transforms``; the goal is a first fix of at least 1.5x the throughput.
* ``timm``: ``timm.data.create_loader(ImageFolder(root), 224, is_training=True)`` with its defaults (the
  PrefetchLoader, ColorJitter 0.4, bilinear RandomResizedCropAndInterpolation), passed as it is: fastpipe unwraps it.

With ``--diagnose``, ``fastpipe.diagnose`` runs first and its table is printed (the stages it names are passed on).

Combined fixes: after the single fixes, ``fix`` joins the ones that helped and change different parts (decode the crop
and/or uint8 over the copy, the worker count tune chose, recycled batch memory) into one candidate and measures it
against the original and the best single fix in one rotated run; the script prints that run's ratio of the set's
throughput to the best single fix's, and what the report recommends (the best measured, single or combined).

Usage:
    python benchmarks/bench_fix.py [--pipelines torchvision timm] [--device sim:20] [--n 256] [--batch-size 32]
        [--workers N] [--steps 10] [--budget 20] [--diagnose] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
import torchvision
import torchvision.transforms as T

from fastpipe._system import usable_cores
from fastpipe.experiments._fix import fix
from fastpipe.workloads._workload import Workload, as_workload
from fastpipe.workloads.photos import build_corpus, default_root

GOAL = 1.5
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class PresetTrain:
    """torchvision's reference ClassificationPresetTrain with its defaults (backend "pil", v1 transforms)."""

    def __init__(self, crop_size: int, hflip_prob: float = 0.5) -> None:
        stages: list[Any] = [T.RandomResizedCrop(crop_size, interpolation=T.InterpolationMode.BILINEAR, antialias=True)]
        if hflip_prob > 0:
            stages.append(T.RandomHorizontalFlip(hflip_prob))
        stages += [T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(mean=MEAN, std=STD)]
        self.transforms = T.Compose(stages)

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


def _step(batch: Any) -> None:
    return None


def torchvision_workload(root: str, batch_size: int, workers: int) -> Workload:
    dataset = torchvision.datasets.ImageFolder(root, PresetTrain(224))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=True, drop_last=True)
    return as_workload((loader, _step), "torchvision preset (ImageFolder + PresetTrain)")


def timm_workload(root: str, batch_size: int, workers: int) -> Workload:
    from timm.data import create_loader

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = create_loader(torchvision.datasets.ImageFolder(root), 224, batch_size, is_training=True, num_workers=workers, device=device)
    return as_workload((loader, _step), "timm create_loader (PrefetchLoader)")


BUILDERS = {"torchvision": torchvision_workload, "timm": timm_workload}


def run(name: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    workload = BUILDERS[name](root, args.batch_size, args.workers)
    print(f"\n=== {name}: {workload.name}, batch {args.batch_size}, {args.workers} workers, on {args.device} ===", flush=True)
    for note in workload.notes:
        print(f"note: {note}")
    named = None
    if args.diagnose:
        import fastpipe

        options = fastpipe.DiagnoseOptions(steps=args.steps, budget=args.budget, loader_memory=False, startup=False)
        report = fastpipe.diagnose(workload, device=args.device, options=options)
        print(report.to_table())
        named = [b.stage for b in report.bottlenecks]
    started = time.perf_counter()
    measure = fastpipe.MeasureOptions(steps=args.steps, warmup=args.warmup, budget=args.budget)
    fixes = fix(workload, device=args.device, options=measure, named=named)
    took = time.perf_counter() - started
    print(fixes.to_table())
    out: dict[str, Any] = {"pipeline": name, "fix_seconds": took, "report": fixes.to_dict()}
    if fixes.recommended:
        first = fixes.recommended[0]
        ratio = first.original_ms / first.ms_per_step
        goal = f" (goal {GOAL}x: {'met' if ratio >= GOAL else 'NOT met'})" if name == "torchvision" else ""
        print(
            f"first fix, measured in the same run as the original: {first.name}: {first.original_ms:.0f} -> "
            f"{first.ms_per_step:.0f} ms a step, {ratio:.2f}x the throughput{goal}"
        )
        out["first_fix"] = {"name": first.name, "original_ms": first.original_ms, "fixed_ms": first.ms_per_step, "ratio": ratio}
    else:
        print("first fix: none measured faster beyond noise")
    combined = [r for r in fixes.results if r.name.startswith("combined:")]
    if combined and combined[0].single_ms is not None and combined[0].ms_per_step is not None:
        c = combined[0]
        ratio = c.single_ms / c.ms_per_step
        print(
            f"combined set against the best single fix, measured in one rotated run with the original: {c.name}: "
            f"{c.ms_per_step:.0f} ms a step against {c.single_ms:.0f} for {c.single} ({ratio:.2f}x the throughput; "
            f"{c.original_ms:.0f} ms the original in that run, {c.original_ms / c.ms_per_step:.2f}x); status: {c.status}"
        )
        out["combined"] = {
            "name": c.name,
            "ms": c.ms_per_step,
            "single": c.single,
            "single_ms": c.single_ms,
            "original_ms": c.original_ms,
            "ratio_to_single": ratio,
            "status": c.status,
        }
    else:
        why = [n for n in fixes.notes if n.startswith("no combined fix")]
        print(f"combined set: not measured ({why[0] if why else 'fewer than two fixes helped'})")
    print(f"recommended (the best measured, single or combined): {fixes.best or 'nothing'}")
    out["best"] = fixes.best
    print(f"fix took {took:.0f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", nargs="+", choices=sorted(BUILDERS), default=["torchvision", "timm"])
    parser.add_argument("--device", default="sim:20", help="where the pipelines are input-bound (default sim:20, the issue's step)")
    parser.add_argument("--n", type=int, default=256, help="photos in the corpus (default 256)")
    parser.add_argument("--root", default=None, help="the corpus folder (default: the cached one for --n)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=max(1, min(4, usable_cores() - 1)))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds of measuring per rung (default 20)")
    parser.add_argument("--diagnose", action="store_true", help="run fastpipe.diagnose first and print its table")
    parser.add_argument("--json", default=None, help="write every report and figure here")
    args = parser.parse_args(argv)
    root = os.fspath(build_corpus(args.root or default_root(args.n, 0), n=args.n, seed=0))
    load = os.getloadavg()
    print(
        f"machine: {usable_cores()} usable cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; corpus {root} ({args.n} photos)"
    )
    results = [run(name, args, root) for name in args.pipelines]
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "batch_size": args.batch_size, "workers": args.workers, "results": results}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
