"""``fastpipe diagnose [OPTIONS] -- python SCRIPT ARGS``: the cache ladder inside an unmodified training script.

The flags are ``fastpipe diagnose``'s (``--budget`` too: seconds of measuring per cache point, as with a factory), with
three of script mode's own (``--loader``, ``--then-continue``, and ``--budget-steps``, a cap on the script's steps the
whole ladder may take: what ``--budget`` meant here before); the work is :mod:`fastpipe.diagnosis._script`'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from fastpipe.errors import ConfigError

OLD_BUDGET_HINT = 100
"""A whole ``--budget`` this large was most likely meant as steps (script mode's old unit, 600 by default): a note says
it now counts seconds per cache point."""


def add_script_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("a training script (fastpipe diagnose [OPTIONS] -- python SCRIPT [ARGS ...])")
    group.add_argument(
        "--loader",
        type=int,
        default=None,
        metavar="N",
        help="the script's training DataLoader: the Nth it iterates, from 1 (default: the one with the longest epoch among "
        "those the script holds, taken at its 5th batch; a validation or warm-up loader iterated first is passed over)",
    )
    group.add_argument(
        "--then-continue",
        action="store_true",
        help="after the report, put the script's state back and let it train on with its real loader "
        "(default: a dry run, the script is stopped after the report, exit 0)",
    )
    group.add_argument(
        "--budget-steps",
        type=int,
        default=None,
        metavar="N",
        help="the most steps of the script's loop the whole ladder may take (default: no cap; each point has its --budget "
        "seconds); a ladder that reaches it stops at its budget and reports the points it measured",
    )
    group.add_argument("script", nargs="*", metavar="-- python SCRIPT ARGS", help=argparse.SUPPRESS)


def is_script(args: argparse.Namespace) -> bool:
    """Whether the command line names a script (``-- python train.py``, ``-- train.py``, ``-- python -m pkg``)."""
    spec = args.spec or ""
    return bool(args.script) or spec.endswith(".py") or Path(spec).name.startswith("python") or spec == sys.executable


def check_no_script_options(args: argparse.Namespace) -> None:
    """A SPEC run: no script arguments, no script-only flags."""
    if args.spec is None:
        raise ConfigError(
            "fastpipe diagnose needs a SPEC (toy:naive, module:make_workload) or a script: fastpipe diagnose -- python train.py ARGS"
        )
    if args.loader is not None or args.then_continue or args.budget_steps is not None:
        raise ConfigError(
            "--loader, --then-continue and --budget-steps apply to a script: fastpipe diagnose [OPTIONS] -- python train.py ARGS"
        )
    if getattr(args, "patch", None) is not None:
        raise ConfigError(
            "--patch writes a diff of a script's own files: fastpipe fix --patch FILE -- python train.py ARGS "
            "(a SPEC's fixes are printed as code to apply by hand)"
        )


def script_command(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """``(kind, target, args)`` as ``fastpipe watch`` reads them, with this command's name in its errors."""
    from fastpipe.commands.watch import parse_command

    try:
        return parse_command([args.spec, *args.script])
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("fastpipe watch", "fastpipe diagnose")) from None


def run_script(args: argparse.Namespace, fix: str | None = None) -> int:
    """Run the script with the ladder in its loop; ``fix``: ``"after"`` (``diagnose --fix``: the fixes too, measured in
    its loop after the ladder) or ``"only"`` (``fastpipe fix -- python train.py``: the fixes alone)."""
    from fastpipe.commands.common import diagnose_options_from, write_outputs
    from fastpipe.diagnosis._script import DEFAULT_BUDGET_S, ScriptLadder, ScriptOptions, run_script

    ladder = diagnose_options_from(args)  # the ladder's knobs, checked before the script starts
    patch_path = getattr(args, "patch", None)
    if patch_path is not None and fix is None:
        raise ConfigError("--patch writes the fix the measured fixes recommend: add --fix (or run fastpipe fix -- python ...)")
    if getattr(args, "check_step", False):
        raise ConfigError("--check-step runs a factory's step; with a script, the script's own step runs in the ladder")
    kind, target, script_args = script_command(args)
    budget = ladder.budget
    options = ScriptOptions(
        loader=args.loader,
        budget_s=budget,
        budget_steps=args.budget_steps,
        progress=not args.no_progress,
        then_continue=args.then_continue,
        device=args.device,
        steps=ladder.steps,
        warmup=ladder.warmup,
        pool=ladder.pool,
        threshold=ladder.threshold,
        precision=ladder.precision,
        strategy=ladder.strategy,
        stage_costs=ladder.stage_costs,
        loader_memory=ladder.loader_memory,
        fix=fix,
        fix_budget_s=getattr(args, "fix_budget", None),
    )
    options.check()

    def echo(line: str) -> None:  # stderr: stdout stays the script's; flushed first so the two interleave in order
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)

    if fix is None and budget >= OLD_BUDGET_HINT and float(budget).is_integer():
        echo(
            f"fastpipe diagnose: note: --budget {budget:g} gives each cache point up to {budget:g} s of measuring, as with a "
            "factory; it no longer counts the script's steps (it did before, 600 by default: --budget-steps N caps them "
            f"now). The announcement says how long the ladder may take; the default is {DEFAULT_BUDGET_S:g} s a point"
        )

    fix_reports: list[Any] = []

    def show(report: Any) -> None:
        from fastpipe.experiments._fix import FixReport

        sys.stderr.flush()
        if isinstance(report, FixReport):
            fix_reports.append(report)
        if isinstance(report, FixReport) and fix == "after":  # diagnose --fix: the diagnosis's files are its own
            print(report.to_table())
            if args.fix_json is not None:
                args.fix_json.parent.mkdir(parents=True, exist_ok=True)
                args.fix_json.write_text(report.to_json())
                print(f"wrote {args.fix_json}")
        else:
            write_outputs(report, args)
        sys.stdout.flush()

    hooks = None
    if fix is not None:
        from fastpipe.experiments._script_fix import HOOKS as hooks
    session = ScriptLadder(options, script=target, echo=echo, show=show, fix_hooks=hooks)
    if patch_path is None:
        return run_script(kind, target, script_args, session)
    from fastpipe.commands.fix import write_patch_file
    from fastpipe.experiments._sites import SiteRecorder

    # where the script builds its loader, dataset and transform and copies its batches: recorded while it runs
    recorder = SiteRecorder(target if kind == "path" else os.path.join(os.getcwd(), "__main__.py"))
    with recorder:
        code = run_script(kind, target, script_args, session)
    write_patch_file(patch_path, target, fix_reports[-1] if fix_reports else None, recorder)
    return code
