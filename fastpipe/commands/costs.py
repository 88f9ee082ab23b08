"""``fastpipe costs SPEC``: where the workers' time goes, stage by stage, measured inside them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastpipe.commands.common import add_step_arguments, add_workload_arguments, check_output_paths, workload_from_args, write_outputs


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("costs", help="time each pipeline stage inside the DataLoader workers")
    add_workload_arguments(parser)
    add_step_arguments(parser, "pass")
    parser.add_argument("--check-overhead", action="store_true", help="also run untimed, to check that timing does not slow the pipeline")
    parser.add_argument("--json", type=Path, default=None, help="write the stage costs as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the stage costs as Markdown here")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.diagnosis.memory._loader import loader_budget_warning
    from fastpipe.diagnosis.stagecost import measure_stage_costs

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback at the end
    device, workload = workload_from_args(args)
    warning = loader_budget_warning(workload.loader)  # before any worker starts: a loader that would die says why first
    if warning:
        print(f"fastpipe: warning: {warning}", file=sys.stderr)
    costs = measure_stage_costs(workload, device, steps=args.steps, warmup=args.warmup, check_overhead=args.check_overhead)
    write_outputs(costs, args)
    return 0
