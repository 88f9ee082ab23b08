"""The thread loader against the DataLoader at 4, 8 and 16 workers/threads, in images per second (issue 39).

For a many-core GPU host: ``fastpipe.datasets.ThreadLoader(threads=N)`` (native threads in the training
process) against ``DataLoader(fastpipe.datasets.ImageFolder, num_workers=N, persistent_workers=True)`` (worker
processes), both decoding the same real-photo JPEGs with fastpipe's crop-decode op into 224x224 uint8 batches
(RandomResizedCrop + flip). Each loader runs one untimed epoch (worker start-up, first touches), then timed epochs
until ``--seconds`` per loader are spent (at least one); the figure is images over the timed epochs' wall time.
The counts run interleaved (4: thread, DataLoader; 8: ...) so a change of load hits both alike. A count above
the machine's usable cores oversubscribes them: the table says how many there are.

Usage:
    python benchmarks/gpu_loaders.py [--counts 4,8,16] [--n 2000] [--batch 64] [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def epoch_images(loader: Any) -> int:
    return sum(int(images.shape[0]) for images, _ in loader)


def measure(loader: Any, seconds: float) -> dict[str, float]:
    """Images/s over whole epochs after one untimed epoch."""
    began = time.perf_counter()
    epoch_images(loader)
    first_s = time.perf_counter() - began
    images, start = 0, time.perf_counter()
    while True:
        images += epoch_images(loader)
        wall = time.perf_counter() - start
        if wall >= seconds:
            return {"images_per_s": images / wall, "timed_images": images, "timed_s": wall, "first_epoch_s": first_s}


def make(kind: str, files: list[Path], count: int, batch: int) -> Any:
    from thread_loaders import _worker_init, dataset_for  # noqa: PLC0415  (the same dataset as the 2-core table's)
    from torch.utils.data import DataLoader

    from fastpipe.datasets import ThreadLoader

    if kind == "thread":
        return ThreadLoader(dataset_for(files), batch_size=batch, shuffle=True, threads=count)
    return DataLoader(
        dataset_for(files), batch_size=batch, shuffle=True, num_workers=count, persistent_workers=True, worker_init_fn=_worker_init
    )


def close(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
    shutdown = getattr(loader, "close", None)
    if shutdown is not None:
        shutdown()


def format_table(result: dict[str, Any]) -> str:
    lines = [f"images/s, 224x224 crops of {result['files']} real-photo JPEGs, batch {result['batch']}, on {result['machine']}"]
    lines.append(f"{'count':>5}  {'thread loader':>14}  {'DataLoader':>11}  {'thread / DataLoader':>19}")
    for row in result["rows"]:
        ratio = row["thread"]["images_per_s"] / row["dataloader"]["images_per_s"]
        lines.append(
            f"{row['count']:>5}  {row['thread']['images_per_s']:>14.0f}  {row['dataloader']['images_per_s']:>11.0f}  {ratio:>18.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from fastpipe._system import usable_cores
    from fastpipe.workloads.photos import build_corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="4,8,16", help="workers / threads, comma-separated (default 4,8,16)")
    parser.add_argument("--n", type=int, default=2000, help="corpus size (fastpipe.workloads.photos; default 2000, the jpeg workloads')")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per loader and count (default 3)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    counts = [int(c) for c in args.counts.split(",") if c.strip()]
    files = sorted(Path(build_corpus(n=args.n, verbose=True)).rglob("*.jpg"))
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    result: dict[str, Any] = {"machine": f"{usable_cores()} usable cores, {gpu}", "files": len(files), "batch": args.batch, "rows": []}
    for count in counts:
        row: dict[str, Any] = {"count": count}
        for kind in ("thread", "dataloader"):
            loader = make(kind, files, count, args.batch)
            try:
                row[kind] = measure(loader, args.seconds)
            finally:
                close(loader)
            print(
                f"{kind:>10} x{count}: {row[kind]['images_per_s']:.0f} images/s (first epoch {row[kind]['first_epoch_s']:.1f} s)",
                flush=True,
            )
        result["rows"].append(row)
        if args.json:  # after every count, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(result, indent=2))
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
