"""GPU decode (nvjpeg) against fastpipe's CPU decode-crop op, in images per second (issue 39).

Every candidate turns the bytes of real-photo JPEGs (read beforehand) into 224x224 uint8 RandomResizedCrop + flip
samples:

* ``nvjpeg (cuda, batch B)``: :class:`fastpipe.datasets.DecodeCropOnDevice` on CUDA, one batched
  ``torchvision.io.decode_jpeg(device="cuda")`` call per batch, then the crops resized on the GPU; timed to a
  ``torch.cuda.synchronize()``; one untimed batch first (nvjpeg's set-up). "skipped: no CUDA" without a GPU;
* ``fastpipe op (1 thread)``: ``fastpipe.ops.decode_jpeg_crop`` file by file on one thread;
* ``fastpipe batch op (T threads)``: ``fastpipe.ops.decode_jpeg_crop_batch`` with T native threads, T = the
  usable cores (what a host gives the decode when nothing else runs).

Boxes for the CPU op are drawn as the recipe draws them (``RandomResizedCrop.get_params`` on each file's header
size), once, and reused every pass. Each candidate runs passes over the files until ``--seconds`` are spent.

Usage:
    python benchmarks/gpu_decode.py [--n 2000] [--batch 128] [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

SIZE = 224


def timed(run_pass: Callable[[], int], seconds: float) -> dict[str, float]:
    """Images/s over whole passes until ``seconds`` are spent (at least one pass)."""
    images, start = 0, time.perf_counter()
    while True:
        images += run_pass()
        wall = time.perf_counter() - start
        if wall >= seconds:
            return {"images_per_s": images / wall, "images": images, "seconds": wall}


def main(argv: list[str] | None = None) -> int:
    from fastpipe._system import usable_cores
    from fastpipe.datasets import DecodeCropOnDevice
    from fastpipe.datasets.crop import crop_params
    from fastpipe.ops import jpeg as jpeg_ops
    from fastpipe.ops.jpeg_batch import decode_jpeg_crop_batch
    from fastpipe.workloads.photos import build_corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="corpus size (default 2000, the jpeg workloads')")
    parser.add_argument("--batch", type=int, default=128, help="files per nvjpeg call (default 128)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per candidate (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="the batch op's threads (default: the usable cores)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    threads = args.threads or usable_cores()
    files = sorted(Path(build_corpus(n=args.n, verbose=True)).rglob("*.jpg"))
    data = [jpeg_ops.read_bytes(f) for f in files]
    data = [d for d in data if jpeg_ops.is_jpeg(d)]
    generator = torch.Generator().manual_seed(0)
    boxes = []
    for d in data:
        height, width = jpeg_ops.jpeg_size(d)
        boxes.append(crop_params(height, width))
    flips = (torch.rand(len(data), generator=generator) < 0.5).tolist()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    result: dict[str, Any] = {
        "machine": f"{usable_cores()} usable cores, {gpu}",
        "files": len(data),
        "size": SIZE,
        "decoder": jpeg_ops.jpeg_op_status(),
        "rows": {},
    }

    def save() -> None:
        if args.json:  # after every row, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(result, indent=2))

    def one_thread() -> int:
        for d, box, flip in zip(data, boxes, flips):
            jpeg_ops.decode_jpeg_crop(d, box, (SIZE, SIZE), flip)
        return len(data)

    out = torch.empty((args.batch, 3, SIZE, SIZE), dtype=torch.uint8)

    def batched() -> int:
        for i in range(0, len(data), args.batch):
            chunk = data[i : i + args.batch]
            decode_jpeg_crop_batch(
                chunk, boxes[i : i + len(chunk)], (SIZE, SIZE), flips[i : i + len(chunk)], out=out[: len(chunk)], threads=threads
            )
        return len(data)

    rows: list[tuple[str, Callable[[], int] | None, str]] = [
        ("fastpipe op (1 thread)", one_thread, ""),
        (f"fastpipe batch op ({threads} threads)", batched, ""),
    ]
    if torch.cuda.is_available():
        decode = DecodeCropOnDevice(SIZE, device="cuda")

        def nvjpeg() -> int:
            for i in range(0, len(data), args.batch):
                decode.images(data[i : i + args.batch], torch.device("cuda"))
            torch.cuda.synchronize()
            return len(data)

        decode.images(data[: args.batch], torch.device("cuda"))  # nvjpeg's handles and buffers
        torch.cuda.synchronize()
        rows.insert(0, (f"nvjpeg (cuda, batch {args.batch})", nvjpeg, ""))
    else:
        rows.insert(0, (f"nvjpeg (cuda, batch {args.batch})", None, "skipped: no CUDA"))
    for name, run_pass, why in rows:
        result["rows"][name] = {"skipped": why} if run_pass is None else timed(run_pass, args.seconds)
        shown = why or f"{result['rows'][name]['images_per_s']:.0f} images/s"
        print(f"{name}: {shown}", flush=True)
        save()
    measured = {k: v["images_per_s"] for k, v in result["rows"].items() if "images_per_s" in v}
    print(f"images/s, {SIZE}x{SIZE} crops of {len(data)} real-photo JPEGs, on {result['machine']} ({result['decoder']})")
    for name, value in measured.items():
        print(f"  {name:<40} {value:>9.0f}")
    gpu_row = next((k for k in measured if k.startswith("nvjpeg")), None)
    cpu_row = next((k for k in measured if k.startswith("fastpipe batch op")), None)
    if gpu_row and cpu_row:
        result["gpu_over_cpu"] = measured[gpu_row] / measured[cpu_row]
        print(f"  nvjpeg / the CPU op on every usable core: {result['gpu_over_cpu']:.2f}x")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
