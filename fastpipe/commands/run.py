"""``fastpipe run SPEC``: the plain training loop, nothing cached, and its steps/s."""
from __future__ import annotations

import argparse
from typing import Any

from fastpipe.commands.common import add_workload_arguments, toy_options
from fastpipe.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("run", help="run the training loop and print steps/s (nothing cached)")
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=10, help="measured steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.devices import parse_device
    from fastpipe.measure import measure_workload
    from fastpipe.workload import load_workload

    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be at least 1 and --warmup at least 0")
    device = parse_device(args.device)
    workload = load_workload(args.spec, device, **toy_options(args))
    result = measure_workload(workload, device, warmup=args.warmup, steps=args.steps)
    print(
        f"{workload.name} on {device.spec}: {result.steps_per_s:.3f} steps/s "
        f"(spread {result.spread:.1%}, process CPU {result.cpu_util:.0%} of {args.steps} steps)"
    )
    return 0
