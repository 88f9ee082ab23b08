"""``fastpipe compare toy`` or ``fastpipe compare mod:before mod:after``: what each change bought."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastpipe.commands.common import (
    add_device_argument,
    add_measure_flags,
    add_toy_options,
    check_output_paths,
    measure_options_from,
    resolve_device,
    toy_option_values,
    write_outputs,
)
from fastpipe.errors import ConfigError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("compare", help="measure a ladder of variants against the device bound")
    parser.add_argument(
        "specs",
        metavar="SPEC",
        nargs="+",
        help="'toy' or 'jpeg' for a built-in ladder, two or more SPECs (module:function), "
        "or two scripts: -- python train.py ARGS -- python train_patched.py ARGS (each timed in its own loop)",
    )
    add_device_argument(parser)
    add_measure_flags(parser, "rung")
    parser.add_argument("--json", type=Path, default=None, help="write the comparison as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the comparison as Markdown here")
    parser.add_argument("--plot", type=Path, default=None, help="write a bar chart PNG here (needs matplotlib)")
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip each rung's short memory pass after the timing rounds (shared-memory peak, worker USS, pinned)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--rounds", type=int, default=4, help="two scripts: rounds of one run each, in rotated order (default 4)")
    parser.add_argument(
        "--expected", default=None, metavar="GAIN", help="two scripts: the gain fix measured (+300%% or 3.0), to say how much held"
    )
    add_toy_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.experiments._compare import compare
    from fastpipe.experiments._compare_scripts import is_scripts, run_cli
    from fastpipe.workloads._workload import family_of

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback at the end
    if is_scripts(args.specs):
        return run_cli(args)
    options = measure_options_from(args)
    if args.specs not in (["toy"], ["jpeg"]) and len(args.specs) < 2:
        raise ConfigError("compare needs 'toy', 'jpeg' or at least two SPECs, e.g. fastpipe compare mypkg.before:make mypkg.after:make")
    is_builtin = all(family_of(spec) is not None for spec in args.specs)
    comparison = compare(
        args.specs,
        device=resolve_device(args.device, args.specs),
        options=options,
        progress=not args.no_progress and sys.stderr.isatty(),
        toy_options=toy_option_values(args, is_builtin),
        memory=not args.no_memory,
    )
    write_outputs(comparison, args)
    return 0
