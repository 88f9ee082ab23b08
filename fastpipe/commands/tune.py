"""``fastpipe tune SPEC``: the fewest workers and the shallowest prefetch that keep the device fed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastpipe.commands.common import (
    add_measure_flags,
    add_workload_arguments,
    check_output_paths,
    measure_options_from,
    workload_from_args,
    write_outputs,
)
from fastpipe.errors import ConfigError


def _factors(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 separated by commas, e.g. 2,4; got {text!r}")
    return values


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("tune", help="sweep num_workers and prefetch_factor; recommend the cheapest setting that keeps up")
    add_workload_arguments(parser)
    add_measure_flags(parser, "setting")
    parser.add_argument("--max-workers", type=int, default=None, help="most workers to try (default: usable cores + 2)")
    parser.add_argument(
        "--prefetch-factors", type=_factors, default=[2, 4], help="prefetch_factor values to try at the chosen count (default 2,4)"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="differences in time per step below this fraction of the device step count as noise (default 0.05); two settings within it of the longer step are equally good",
    )
    parser.add_argument(
        "--shm-budget-mb", type=float, default=None, help="shared memory the loader may use, in MB (default: what /dev/shm has free)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the sweep as JSON here")
    parser.set_defaults(handler=run)


def _progress(trial: Any) -> None:
    rate = (
        "not run"
        if trial.step_ms is None
        else (f"{trial.step_ms:.1f} ms per step, {trial.steps_per_s:.3f} steps/s ({trial.fraction_of_bound:.0%} of the bound)")
    )
    print(f"tried num_workers={trial.num_workers}, prefetch_factor={trial.prefetch_factor}: {rate}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from fastpipe.experiments._tune import tune

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback at the end
    if args.max_workers is not None and args.max_workers < 1:
        raise ConfigError(f"--max-workers must be at least 1, got {args.max_workers}")
    if args.shm_budget_mb is not None and args.shm_budget_mb <= 0:
        raise ConfigError(f"--shm-budget-mb must be positive, got {args.shm_budget_mb}")
    options = measure_options_from(args)
    device, workload = workload_from_args(args)
    result = tune(
        workload,
        device=device,
        options=options,
        max_workers=args.max_workers,
        prefetch_factors=args.prefetch_factors,
        tolerance=args.tolerance,
        shm_budget_bytes=None if args.shm_budget_mb is None else int(args.shm_budget_mb * 1e6),
        on_trial=_progress,
    )
    write_outputs(result, args)
    return 130 if result.interrupted else 0
