"""What feeding the trainer from Ray Data costs: ``toy:optimized`` on a local DataLoader against ``toy:ray``.

Both run the same pipeline (the optimized toy: crop-first noise, fast RandomMask, uint8 to the
device, colour and scale on the device, prefetching) on the same number of CPUs, against the
simulated device, and report steps/s, the fraction of the device bound, and the process tree's
CPU use. On one machine Ray cannot add CPUs, so this measures only what Ray costs; on a cluster
the same ``toy:ray`` adds the other nodes' CPUs (README, "Data servers on a Ray cluster").

"CPU s/batch" is the CPU the whole process tree (driver, DataLoader workers or Ray's tasks and
its own processes) spent per batch: what each batch costs whatever the machine's load, and so
what another node's cores would buy.

Two devices by default: ``sim:290`` (the article's A10G bound, which both loaders may reach, so
the overhead hides behind the step) and a faster one that leaves both input-bound, where the
overhead shows in full. Local and Ray runs alternate, round after round, so drift from other
users of a shared machine hits both; each row is the mean over rounds, and the overhead is given
with two standard errors.

Usage:
    python benchmarks/bench_ray.py [--devices sim:290,sim:60] [--workers N] [--rounds 2] [--steps 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from fastpipe import MeasureOptions
from fastpipe._system import usable_cores
from fastpipe.devices import parse_device
from fastpipe.diagnosis.ladder._measure import Measurement, measure_workload
from fastpipe.diagnosis.ladder._points import measure_points
from fastpipe.distributed import cluster as ray_cluster
from fastpipe.distributed import ray_stats_notes
from fastpipe.workloads.toy.optimized import OPTIMIZED, make_toy_variant
from fastpipe.workloads.toy.ray import make_ray


@dataclass
class Row:
    device: str
    loader: str
    steps_per_s: list[float] = field(default_factory=list)
    rel_stderr: list[float] = field(default_factory=list)
    cpu_util: list[float] = field(default_factory=list)
    system_cpu_util: list[float] = field(default_factory=list)

    def add(self, m: Measurement) -> None:
        self.steps_per_s.append(m.steps_per_s)
        self.rel_stderr.append(m.rel_stderr)
        self.cpu_util.append(m.cpu_util)
        self.system_cpu_util.append(m.system_cpu_util)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.steps_per_s)

    @property
    def cpu_s_per_batch(self) -> float:
        """CPU seconds the process tree (driver, workers, Ray's own processes) spent per batch: load-robust cost."""
        return statistics.fmean(u * usable_cores() / s for u, s in zip(self.cpu_util, self.steps_per_s))

    @property
    def stderr(self) -> float:
        """Standard error of the mean steps/s: across rounds if there are several, else within the run."""
        if len(self.steps_per_s) >= 2:
            return statistics.stdev(self.steps_per_s) / math.sqrt(len(self.steps_per_s))
        return self.steps_per_s[0] * self.rel_stderr[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="sim:290,sim:60", help="comma-separated sim devices (default sim:290,sim:60)")
    parser.add_argument("--workers", type=int, default=min(4, usable_cores()), help="DataLoader workers = Ray CPUs (default: toy default)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating local/Ray rounds per device (default 2)")
    parser.add_argument("--steps", type=int, default=12, help="measured steps per run (default 12)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps per run (default 4)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--img-size", type=int, default=256)
    parser.add_argument("--raw-size", type=int, default=1024)
    parser.add_argument("--object-store-mb", type=int, default=512, help="object store of the local Ray cluster (default 512)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = dict(batch_size=args.batch_size, img_size=args.img_size, raw_size=args.raw_size)
    rows: list[Row] = []
    bounds: dict[str, float] = {}
    notes: list[str] = []
    started = time.perf_counter()
    try:
        for spec in args.devices.split(","):
            device = parse_device(spec.strip())
            local_row, ray_row = Row(device.spec, "DataLoader"), Row(device.spec, "Ray Data")
            local = make_toy_variant(device, OPTIMIZED, name="toy:optimized", num_workers=args.workers, **sizes)
            bounds[device.spec] = measure_points(local, device, ["device"], options=MeasureOptions(steps=args.steps, warmup=args.warmup))[
                "device"
            ].steps_per_s
            ray_workload = make_ray(device, num_workers=args.workers, object_store_memory=args.object_store_mb * 1024**2, **sizes)
            for _ in range(args.rounds):
                local_row.add(measure_workload(local, device, warmup=args.warmup, steps=args.steps))
                ray_row.add(measure_workload(ray_workload, device, warmup=args.warmup, steps=args.steps))
                print(
                    f"  {device.spec}: DataLoader {local_row.steps_per_s[-1]:.3f}, Ray {ray_row.steps_per_s[-1]:.3f} steps/s",
                    file=sys.stderr,
                )
            notes += [f"{device.spec}: {note}" for note in ray_stats_notes(ray_workload.loader)]
            rows += [local_row, ray_row]
    finally:
        ray_cluster.shutdown_owned()
    elapsed = time.perf_counter() - started
    print_table(rows, bounds, args, notes, elapsed)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"bounds": bounds, "rows": [asdict(r) for r in rows], "args": vars(args), "elapsed_s": elapsed}, out, indent=2)
    return 0


def print_table(rows: list[Row], bounds: dict[str, float], args: argparse.Namespace, notes: list[str], elapsed: float) -> None:
    print(
        f"toy:optimized, batch {args.batch_size}, raw {args.raw_size}, crop {args.img_size}; {args.workers} DataLoader workers "
        f"vs {args.workers} Ray CPUs (local cluster); {args.rounds} round(s) of {args.steps} steps after {args.warmup} warm-up; "
        f"{usable_cores()} usable cores; {elapsed:.0f} s"
    )
    print(f"{'device':<9} {'loader':<11} {'steps/s':>14} {'of bound':>9} {'CPU (tree)':>11} {'CPU s/batch':>12} {'CPU (machine)':>14}")
    for row in rows:
        bound = bounds[row.device]
        print(
            f"{row.device:<9} {row.loader:<11} {row.mean:>7.3f} ±{2 * row.stderr:<5.3f} {row.mean / bound:>9.1%} "
            f"{statistics.fmean(row.cpu_util):>11.0%} {row.cpu_s_per_batch:>12.3f} {statistics.fmean(row.system_cpu_util):>14.0%}"
        )
    for device, bound in bounds.items():
        local = next(r for r in rows if r.device == device and r.loader == "DataLoader")
        ray = next(r for r in rows if r.device == device and r.loader == "Ray Data")
        overhead = 1 - ray.mean / local.mean
        noise = 2 * math.hypot(ray.stderr, local.stderr) / local.mean
        print(
            f"{device}: device bound {bound:.3f} steps/s; Ray Data's throughput cost against the DataLoader: "
            f"{overhead:+.1%} (±{noise:.1%}, two standard errors)"
        )
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
