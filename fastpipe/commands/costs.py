"""``fastpipe costs SPEC``: where the workers' time goes, stage by stage, measured inside them."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fastpipe.commands.common import add_workload_arguments, toy_options, write_outputs
from fastpipe.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("costs", help="time each pipeline stage inside the DataLoader workers")
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=10, help="measured steps (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps (default 3)")
    parser.add_argument("--check-overhead", action="store_true", help="also run untimed, to check that timing does not slow the pipeline")
    parser.add_argument("--json", type=Path, default=None, help="write the stage costs as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the stage costs as Markdown here")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.devices import parse_device
    from fastpipe.stagecost import measure_stage_costs
    from fastpipe.workload import load_workload

    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be at least 1 and --warmup at least 0")
    device = parse_device(args.device)
    workload = load_workload(args.spec, device, **toy_options(args))
    costs = measure_stage_costs(workload, device, steps=args.steps, warmup=args.warmup, check_overhead=args.check_overhead)
    write_outputs(costs, args)
    return 0
