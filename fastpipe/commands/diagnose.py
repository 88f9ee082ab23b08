"""``fastpipe diagnose SPEC``: where does the input pipeline lose throughput?"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastpipe.commands.common import add_step_arguments, add_workload_arguments, check_output_paths, workload_from_args, write_outputs
from fastpipe.commands.fix import add_fix_arguments, run_fix
from fastpipe.commands.script import add_script_arguments, check_no_script_options, is_script, run_script


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="find the bottleneck stages by caching data at successive points",
        usage="fastpipe diagnose [OPTIONS] SPEC\n       fastpipe diagnose [OPTIONS] -- python SCRIPT [ARGS ...]   (or -m MODULE)",
    )
    add_workload_arguments(parser, spec_optional=True)
    add_step_arguments(parser, "experiment")
    parser.add_argument(
        "--pool",
        type=int,
        default=None,
        help="different samples/batches each cache point cycles through (default: 1, or 8 when the first samples differ in size)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="smallest added time per step that counts, as a fraction of the device step (default 0.05)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of measuring per cache point before it stops short of the precision target (default 20; with a "
        "script too: its announcement estimates how long the ladder takes from the script's step time)",
    )
    parser.add_argument(
        "--precision", type=float, default=0.03, help="target relative standard error of each point's mean step time (default 0.03)"
    )
    parser.add_argument("--strategy", choices=("linear", "bisect"), default="linear", help="measure every point, or bisect over the stages")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the report as Markdown here")
    parser.add_argument("--plot", type=Path, default=None, help="write a bar chart PNG here (needs matplotlib)")
    parser.add_argument(
        "--no-stage-costs", action="store_true", help="skip the extra pass that times each stage when a drop appears at a saturated CPU"
    )
    parser.add_argument(
        "--check-step",
        action="store_true",
        help="first run your step once on one real batch (on the CPU for sim, which never runs it), "
        "and stop with its error if it fails; the model's state is restored",
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the short pass after the ladder that reads the loader for worker memory growth and the shared-memory peak "
        "(each cache point's memory at its end is read either way)",
    )
    parser.add_argument(
        "--no-startup",
        action="store_true",
        help="skip the pass that starts the loader twice more to split the wait for its first batch (worker start, "
        "dataset transfer, worker_init_fn, first fetch) and project each fix's saving",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_fix_arguments(parser)
    add_script_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.diagnosis._diagnose import diagnose
    from fastpipe.diagnosis._options import DiagnoseOptions

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback at the end
    if is_script(args):
        return run_script(args, fix="after" if args.fix else None)
    check_no_script_options(args)
    args.budget = 20.0 if args.budget is None else args.budget
    DiagnoseOptions(
        steps=args.steps,
        warmup=args.warmup,
        budget=args.budget,
        precision=args.precision,
        pool=args.pool,
        threshold=args.threshold,
        strategy=args.strategy,
    )  # bad flags fail here, before the workload is built
    device, workload = workload_from_args(args)
    checked = None
    if args.check_step:
        from fastpipe.diagnosis._stepcheck import check_step

        checked = check_step(workload, device)
        print(checked.line(), file=sys.stderr)
    report = diagnose(
        workload,
        device=device,
        steps=args.steps,
        warmup=args.warmup,
        pool=args.pool,
        threshold=args.threshold,
        budget=args.budget,
        precision=args.precision,
        strategy=args.strategy,
        progress=not args.no_progress and sys.stderr.isatty(),
        stage_costs=not args.no_stage_costs,
        loader_memory=not args.no_memory,
        startup=not args.no_startup,
        on_warning=lambda text: print(f"fastpipe: warning: {text}", file=sys.stderr, flush=True),
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
        found = plan(workload, step_ms=report.baseline_step_ms, steps=args.steps, warmup=args.warmup, budget=args.budget)
    except Exception as exc:  # noqa: BLE001 - never lose a finished diagnosis to the plan of its fixes
        return [f"fix: the candidate fixes could not be listed ({type(exc).__name__}: {exc})"]
    return found.lines(args.spec)
