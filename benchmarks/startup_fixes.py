"""Start-up: each fix's projected saving (fastpipe.diagnosis.unseen._startup) against the saving measured by applying it.

    python benchmarks/startup_fixes.py planted [--start-method forkserver] [--repeats 3]
    python benchmarks/startup_fixes.py jpeg:naive --batch-size 32 --num-workers 2

``planted``: benchmarks/startup_planted.py (a dataset object that carries a list of 150,000 records, about 150 MB
pickled; a worker_init_fn that takes 0.5 s; 2 non-persistent workers). The split is measured once; then each fix the split names is applied to a
copy of the loader and the wait is timed side by side with the original, interleaved (original, fixed, original,
fixed...), the median of ``--repeats`` pairs: the first batch of a fresh start, or for persistent_workers the wall
time of a later epoch of 4 batches (its restart included) with and without persistent workers (the pass itself
measures persistent_workers' saving from the first batches of later epochs with kept and fresh workers: this checks
it over whole epochs, on loaders of the benchmark's own). The lighter dataset is applied only in the planted case,
where the benchmark knows it (the same class without the list).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch.utils.data import DataLoader  # noqa: E402

from benchmarks.startup_planted import Carries, make_loader  # noqa: E402
from fastpipe.diagnosis.unseen._startup import measure_startup  # noqa: E402
from fastpipe.loading._rebuild import rebuild_loader  # noqa: E402


def first_batch_s(loader: DataLoader) -> float:
    """The plain wait for the first batch of a fresh epoch, timed from outside (the check of a projection)."""
    start = time.monotonic()
    iterator = iter(loader)
    next(iterator)
    wait = time.monotonic() - start
    iterator._shutdown_workers()
    return wait


def short_epochs(loader: DataLoader, persistent: bool, batches: int = 4) -> DataLoader:
    """The loader with epochs of ``batches`` batches (the first indices), persistent workers or not: epochs that end as
    real ones do, with idle workers, so the restart is paid as a run pays it."""
    size = loader.batch_size or 1
    return rebuild_loader(loader, loader.dataset, sampler=list(range(batches * size)), persistent_workers=persistent)


def later_epoch_s(loader: DataLoader, epochs: int = 3) -> float:
    """The mean wall time of the epochs after the first, each read to its end."""
    times = []
    for _ in range(epochs):
        start = time.monotonic()
        for _ in loader:
            pass
        times.append(time.monotonic() - start)
    return statistics.mean(times[1:])


def measured_saving(original: DataLoader, fixed: DataLoader, wait: Callable[[DataLoader], float], repeats: int) -> tuple[float, float]:
    """(median saving, median wait of the original) over ``repeats`` interleaved pairs."""
    pairs = [(wait(original), wait(fixed)) for _ in range(repeats)]
    return statistics.median(a - b for a, b in pairs), statistics.median(a for a, _ in pairs)


def loader_for(spec: str, args: argparse.Namespace) -> tuple[DataLoader, Any]:
    if spec == "planted":
        return make_loader(start_method=args.start_method), Carries(records=0)
    from fastpipe.workloads import load_workload

    options = {k: v for k, v in (("batch_size", args.batch_size), ("num_workers", args.num_workers)) if v is not None}
    return load_workload(spec, "sim:290", **options).loader, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="planted, or a workload SPEC such as jpeg:naive")
    parser.add_argument("--start-method", default="forkserver", choices=["fork", "forkserver", "spawn"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--num-workers", type=int, default=None)
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    loader, lighter = loader_for(args.spec, args)
    first_batch_s(loader)  # a fork server started, caches warm
    startup = measure_startup(loader)
    print("\n".join(startup.lines()))
    print(f"\n{'fix':44} {'projected s':>12} {'measured s':>11} {'measured/projected':>19} {'original s':>12}")
    print("(original s: the unfixed loader's wait, measured in the same pairs; the split above measured it once)")
    for fix in startup.fixes:
        if fix.name == "persistent_workers=True":
            pairs = [(later_epoch_s(short_epochs(loader, False)), later_epoch_s(short_epochs(loader, True))) for _ in range(args.repeats)]
            measured, base = statistics.median(a - b for a, b in pairs), statistics.median(a for a, _ in pairs)
            print(f"{fix.name:44} {fix.saves_s:12.2f} {measured:11.2f} {measured / fix.saves_s:19.2f} {base:12.2f}")
            continue
        if fix.name.startswith("a cheaper worker_init_fn"):
            fixed, wait = rebuild_loader(loader, loader.dataset, worker_init_fn=None), first_batch_s
        elif fix.name.startswith("fork instead"):
            fixed, wait = rebuild_loader(loader, loader.dataset, multiprocessing_context="fork"), first_batch_s
        elif fix.name.endswith(f"instead of {loader.num_workers}"):
            fixed, wait = rebuild_loader(loader, loader.dataset, num_workers=max(1, loader.num_workers // 2)), first_batch_s
        elif fix.name.startswith("a lighter") and lighter is not None:
            fixed, wait = rebuild_loader(loader, lighter), first_batch_s
        else:
            print(f"{fix.name:44} {fix.saves_s:12.2f} {'(not applied here)':>11}")
            continue
        measured, base = measured_saving(loader, fixed, wait, args.repeats)
        ratio = measured / fix.saves_s if fix.saves_s else float("nan")
        print(f"{fix.name:44} {fix.saves_s:12.2f} {measured:11.2f} {ratio:19.2f} {base:12.2f}")
    print(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
