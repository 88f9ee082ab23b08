"""Is ``toy:naive``'s worker growth copy-on-read or an allocator's warm-up? Both, side by side, in one run.

Runs :func:`fastpipe.diagnosis.memory._loader.measure_loader_memory` on ``toy:naive`` twice, each in its own
process: once as is, once with glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``: freed large buffers go back
to the system instead of raising the threshold and settling in the heap). If the rise goes away with the threshold
fixed, it was glibc's heap settling (a warm-up that levels off), not the workers copying the parent's objects.
Prints, per run and worker: the samples read, the growth per 1,000 samples, the late/early slope ratio (near 0:
it levels off) and whether the growth rule counts it; and the USS floor every ~500 samples.

Usage:
    python benchmarks/memory_toy_warmup.py [--samples 4000] [--batch 32] [--raw 256] [--img 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys
from fastpipe.devices import parse_device
from fastpipe.diagnosis.memory._loader import measure_loader_memory
from fastpipe.workloads._workload import load_workload
samples, batch, raw, img = (int(x) for x in sys.argv[1:5])
workload = load_workload("toy:naive", parse_device("sim:10"), num_workers=2, batch_size=batch, raw_size=raw, img_size=img)
memory = measure_loader_memory(workload.loader, samples=samples, check=False)
print(json.dumps([dict(w.to_dict(), points=w.points) for w in memory.workers]))
"""


def run(env_extra: dict[str, str], args: argparse.Namespace) -> list[dict]:
    env = dict(os.environ, **env_extra)
    argv = [sys.executable, "-W", "ignore", "-c", CHILD, str(args.samples), str(args.batch), str(args.raw), str(args.img)]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--raw", type=int, default=256)
    parser.add_argument("--img", type=int, default=128)
    args = parser.parse_args()
    for label, extra in (("as is", {}), ("MALLOC_MMAP_THRESHOLD_=131072", {"MALLOC_MMAP_THRESHOLD_": "131072"})):
        for w in run(extra, args):
            growth = w["growth_per_1000_samples"]
            late = w["late_ratio"]
            print(
                f"{label:>32}  worker {w['worker']}: {w['samples']} samples, "
                f"growth {'n/a' if growth is None else f'{growth / 1e6:.2f} MB'} per 1,000, "
                f"late/early {'n/a' if late is None else f'{late:.2f}'}, counts as growth: {w['grows']}"
            )
            step = max(1, len(w["points"]) // 10)
            print(" " * 34 + "USS: " + ", ".join(f"{n}:{uss / 1e6:.0f} MB" for n, uss in w["points"][::step]))


if __name__ == "__main__":
    main()
