"""``fastpipe run SPEC``: the plain training loop, nothing cached, and its steps/s."""

from __future__ import annotations

import argparse
from typing import Any

from fastpipe.commands.common import add_step_arguments, add_workload_arguments, workload_from_args


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("run", help="run the training loop and print steps/s (nothing cached)")
    add_workload_arguments(parser)
    add_step_arguments(parser, "run")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.diagnosis.ladder._measure import measure_workload

    device, workload = workload_from_args(args)
    result = measure_workload(workload, device, warmup=args.warmup, steps=args.steps)
    print(
        f"{workload.name} on {device.spec}: {result.steps_per_s:.3f} steps/s "
        f"(spread {result.spread:.1%}, process CPU {result.cpu_util:.0%} of {args.steps} steps)"
    )
    return 0
