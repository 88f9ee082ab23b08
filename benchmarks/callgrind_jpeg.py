"""A fixed workload for callgrind: the decode-and-crop op on the same files and boxes every run.

Why: on a shared, loaded machine wall-clock timings of a 2 ms op drift by more than the changes being weighed;
instruction counts do not. This driver decodes ``--n`` corpus files once each (boxes and flips drawn with a fixed
seed, as ``bench_jpeg_resize.py`` draws them) and, with ``--floor``, runs the entropy floor on the same rows, so
the split between libjpeg, the resize and the rest can be read from one profile.

Usage (only the op's calls are counted):
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='fastpipe::decode_jpeg_crop_into*' \\
        python benchmarks/callgrind_jpeg.py --n 50
    callgrind_annotate --inclusive=yes callgrind.out.<pid>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_jpeg import corpus_files  # noqa: E402
from bench_jpeg_resize import draw_boxes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a folder of JPEGs (default: fastpipe.workloads.photos' corpus)")
    parser.add_argument("--n", type=int, default=50, help="files to decode")
    parser.add_argument("--size", type=int, default=224, help="output side")
    parser.add_argument("--kernel", default="auto", help="resize kernel: auto, portable, avx2 or skip")
    parser.add_argument("--floor", action="store_true", help="also run the entropy floor on each file")
    parser.add_argument("--save", help="write the outputs to this .pt file (to compare two builds byte for byte)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files, origin = corpus_files(args.root, args.n)
    samples = draw_boxes(files, seed=0)
    ops = torch.ops.fastpipe
    ops._jpeg_set_resize_kernel(args.kernel)
    outputs = []
    for data, box, flip in samples:
        outputs.append(ops.decode_jpeg_crop(data, *box, args.size, args.size, flip))
        if args.floor:
            ops._jpeg_entropy_floor(data, box[0] + box[2])
    if args.save:
        torch.save(outputs, args.save)
    print(f"callgrind_jpeg: {len(samples)} files from {origin}, kernel {args.kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
