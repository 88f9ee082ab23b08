"""The ``fastpipe`` command line. Each subcommand lives in a small ``add_*``/``cmd_*`` pair.

Errors a user can cause (FastpipeError) become one line on stderr and exit code 2, never a
traceback; Ctrl-C exits 130.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from fastpipe.errors import FastpipeError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """SPEC, --device and the toy workload's size options, shared by every subcommand that runs one."""
    parser.add_argument("spec", metavar="SPEC", help="toy:naive, toy:optimized, or package.module:function")
    parser.add_argument("--device", default=None, help="cuda[:N], cpu, or sim:STEP_MS[,h2d_gbps=G] (default: cuda if present, else sim:290)")
    toy = parser.add_argument_group("toy workload options (SPEC toy:*)")
    toy.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default: the article's 4, capped at usable cores)")
    toy.add_argument("--batch-size", type=int, default=None, help="batch size (default 256)")
    toy.add_argument("--raw-size", type=int, default=None, help="side of the raw square image (default 1024)")
    toy.add_argument("--img-size", type=int, default=None, help="crop size (default 256)")
    toy.add_argument("--model", default=None, help="torchvision model name for cpu/cuda (default resnet50)")


def toy_options(args: argparse.Namespace) -> dict[str, Any]:
    names = ("num_workers", "batch_size", "raw_size", "img_size", "model")
    options = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if options and not args.spec.startswith("toy"):
        flags = ", ".join("--" + name.replace("_", "-") for name in options)
        raise FastpipeError(f"{flags} only apply to toy:* workloads; size your own workload in its factory")
    for name, value in options.items():
        if name != "model" and (value < 0 or (value == 0 and name != "num_workers")):
            raise FastpipeError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return options


def add_run(subparsers: Any) -> None:
    parser = subparsers.add_parser("run", help="run the training loop and print steps/s (nothing cached)")
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=10, help="measured steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    parser.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from fastpipe.devices import parse_device
    from fastpipe.measure import measure_workload
    from fastpipe.workload import load_workload

    device = parse_device(args.device)
    workload = load_workload(args.spec, device, **toy_options(args))
    result = measure_workload(workload, device, warmup=args.warmup, steps=args.steps)
    print(
        f"{workload.name} on {device.spec}: {result.steps_per_s:.3f} steps/s "
        f"(spread {result.spread:.1%}, process CPU {result.cpu_util:.0%} of {args.steps} steps)"
    )
    return 0


SUBCOMMANDS: list[Callable[[Any], None]] = [add_run]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastpipe", description="Find and fix GPU starvation in PyTorch input pipelines.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except FastpipeError as exc:
        print(f"fastpipe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fastpipe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
