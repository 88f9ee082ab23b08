"""The decode-and-crop op's resize kernels side by side (issue 25, item 3): the op alone, on the same files and
boxes, with the dispatched (AVX2) resize, the portable resize, and the resize skipped, interleaved image by image.

Why a script beside ``bench_jpeg.py``: there the three are whole passes over the files in a shuffled order, so on
a shared machine the load that changes between passes lands on one kernel and not another, and a resize that is a
fifth of the op drowns in it. Here each image is decoded with every kernel in turn (the order rotates), each call
timed on the thread's CPU clock, the bytes read and the box drawn beforehand; the figures are sums over the files,
one per round, and the table gives their medians; the entropy floor (``_jpeg_entropy_floor``, the Huffman
decoding no libjpeg decode can skip; see bench_jpeg.py) is timed in the same rotation. The resize's cost is the op's time minus its time with the
resize skipped, and ``resize speed-up`` compares that cost between the two kernels, all from the same run.

Usage:
    python benchmarks/bench_jpeg_resize.py [--root FOLDER] [--n 300] [--rounds 7] [--size 224]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import fastpipe.ops.jpeg as fjpeg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_jpeg import corpus_files, resize_kernels_available  # noqa: E402


def draw_boxes(files: list[Path], seed: int) -> list[tuple[torch.Tensor, tuple[int, int, int, int], bool]]:
    """Each file's bytes, a RandomResizedCrop box drawn as torchvision draws it, and a flip."""
    import torchvision.transforms as T

    torch.manual_seed(seed)
    out = []
    for path in files:
        data = fjpeg.read_bytes(path)
        height, width = fjpeg.jpeg_size(data)
        box = T.RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(1, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
        out.append((data, tuple(int(v) for v in box), bool(torch.rand(1) < 0.5)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a folder of JPEGs (default: fastpipe.workloads.photos' corpus)")
    parser.add_argument("--n", type=int, default=300, help="files to use")
    parser.add_argument("--rounds", type=int, default=7, help="rounds over the files (each image decoded once per kernel per round)")
    parser.add_argument("--size", type=int, default=224, help="output side")
    args = parser.parse_args(argv)
    if not resize_kernels_available():
        print(f"bench_jpeg_resize: the loaded op cannot choose its resize kernels ({fjpeg.jpeg_op_status()}); rebuild fastpipe._jpeg")
        return 1
    torch.set_num_threads(1)
    files, origin = corpus_files(args.root, args.n)
    samples = draw_boxes(files, seed=0)
    ops = torch.ops.fastpipe
    kernels = {"dispatched": "auto", "portable": "portable", "skipped": "skip"}
    best = ops._jpeg_resize_kernels()[0]
    before = ops._jpeg_set_resize_kernel("auto")
    totals: dict[str, list[float]] = {k: [] for k in [*kernels, "floor"]}
    order = list(totals)
    size = args.size
    try:
        for data, box, flip in samples:  # warm-up: page faults of the scratch buffers, lazy init
            for choice in kernels.values():
                ops._jpeg_set_resize_kernel(choice)
                ops.decode_jpeg_crop(data, *box, size, size, flip)
        for r in range(args.rounds):
            spent = dict.fromkeys(totals, 0.0)
            for i, (data, box, flip) in enumerate(samples):
                shift = (i + r) % len(order)
                for name in order[shift:] + order[:shift]:
                    if name == "floor":
                        start = time.thread_time()
                        ops._jpeg_entropy_floor(data, box[0] + box[2])
                        spent[name] += time.thread_time() - start
                        continue
                    ops._jpeg_set_resize_kernel(kernels[name])
                    start = time.thread_time()
                    ops.decode_jpeg_crop(data, *box, size, size, flip)
                    spent[name] += time.thread_time() - start
            for name in totals:
                totals[name].append(spent[name] * 1e3 / len(samples))
            print(f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {totals[k][-1]:.3f}" for k in totals), flush=True)
    finally:
        ops._jpeg_set_resize_kernel(before)
    med = {k: statistics.median(v) for k, v in totals.items()}
    dispatched, portable, skipped, floor = med["dispatched"], med["portable"], med["skipped"], med["floor"]
    print()
    print(f"bench_jpeg_resize: {len(samples)} files from {origin}; {args.rounds} rounds; output {size}x{size}; dispatched kernel: {best}")
    print("op alone, thread CPU, ms per image (median of the rounds; spread min-max):")
    for name, values in totals.items():
        print(f"  {name:10s} {med[name]:.3f}  ({min(values):.3f}-{max(values):.3f})")
    print(f"resize cost: portable {portable - skipped:.3f} ms, dispatched ({best}) {dispatched - skipped:.3f} ms per image")
    if dispatched > skipped:
        print(f"resize speed-up, dispatched vs portable: {(portable - skipped) / (dispatched - skipped):.2f}x")
    else:  # too few files or rounds for the resize to show above the noise
        print("resize speed-up, dispatched vs portable: not measured (the dispatched resize cost nothing above the noise)")
    print(f"op speed-up, dispatched vs portable: {portable / dispatched:.3f}x")
    print(f"resize share of the op: portable {(portable - skipped) / portable:.0%}, dispatched {(dispatched - skipped) / dispatched:.0%}")
    print(
        f"op / entropy floor (the op alone, not the per-sample path): dispatched {dispatched / floor:.2f}x, portable {portable / floor:.2f}x, "
        f"resize skipped {skipped / floor:.2f}x; above the floor with the resize skipped: {skipped - floor:.3f} ms "
        "(libjpeg's IDCT, upsampling and colour conversion of the box's rows, and the op's setup)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
