"""``fastpipe diagnose SPEC``: where does the input pipeline lose throughput?"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastpipe.commands.common import (
    add_diagnose_flags,
    add_measure_flags,
    add_workload_arguments,
    check_output_paths,
    diagnose_options_from,
    measure_options_from,
    workload_from_args,
    write_outputs,
)
from fastpipe.commands.fix import add_fix_arguments, run_fix
from fastpipe.commands.script import add_script_arguments, check_no_script_options, is_script, run_script


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="find the bottleneck stages by caching data at successive points",
        usage="fastpipe diagnose [OPTIONS] SPEC\n       fastpipe diagnose [OPTIONS] -- python SCRIPT [ARGS ...]   (or -m MODULE)",
    )
    add_workload_arguments(parser, spec_optional=True)
    add_measure_flags(
        parser,
        "cache point",
        budget_help="; with a script too: its announcement estimates how long the ladder takes from the script's step time",
    )
    add_diagnose_flags(parser)
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the report as Markdown here")
    parser.add_argument("--plot", type=Path, default=None, help="write a bar chart PNG here (needs matplotlib)")
    parser.add_argument(
        "--check-step",
        action="store_true",
        help="first run your step once on one real batch (on the CPU for sim, which never runs it), "
        "and stop with its error if it fails; the model's state is restored",
    )
    add_fix_arguments(parser)
    add_script_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.diagnosis._diagnose import run_diagnosis

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback at the end
    if is_script(args):
        return run_script(args, fix="after" if args.fix else None)
    check_no_script_options(args)
    options = diagnose_options_from(args)  # bad flags fail here, before the workload is built
    device, workload = workload_from_args(args)
    checked = None
    if args.check_step:
        from fastpipe.diagnosis._stepcheck import check_step

        checked = check_step(workload, device)
        print(checked.line(), file=sys.stderr)
    report = run_diagnosis(
        workload, device, options, on_warning=lambda text: print(f"fastpipe: warning: {text}", file=sys.stderr, flush=True)
    )
    if checked is not None:
        report.notes.append(checked.line())
    if not args.fix and not report.interrupted:
        report.notes += _fix_plan(workload, report, args)
    write_outputs(report, args)
    if args.fix and not report.interrupted:
        fixes = run_fix(workload, device, args, named=[b.stage for b in report.bottlenecks])
        print(fixes.to_table())
        if args.fix_json is not None:
            args.fix_json.parent.mkdir(parents=True, exist_ok=True)
            args.fix_json.write_text(fixes.to_json())
            print(f"wrote {args.fix_json}")
    return 130 if report.interrupted else 0


def _fix_plan(workload: Any, report: Any, args: argparse.Namespace) -> list[str]:
    """The report's lines on the fixes ``--fix`` would try; a line saying why when they cannot be listed (the
    diagnosis stands either way)."""
    from fastpipe.experiments._fix import plan

    try:
        found = plan(workload, measure_options_from(args), step_ms=report.baseline_step_ms)
    except Exception as exc:  # noqa: BLE001 - never lose a finished diagnosis to the plan of its fixes
        return [f"fix: the candidate fixes could not be listed ({type(exc).__name__}: {exc})"]
    return found.lines(args.spec)
