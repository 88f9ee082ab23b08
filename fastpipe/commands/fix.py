"""``fastpipe fix SPEC``: build the fixes that apply to the pipeline, check each gives the same input, measure them."""

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


def add_fix_arguments(parser: argparse.ArgumentParser) -> None:
    """``diagnose``'s flags for the fixes: ``--fix`` and its budget and JSON file."""
    parser.add_argument(
        "--fix",
        action="store_true",
        help="after the diagnosis, measure the fixes that apply against the original in one run, each input checked "
        "(without it, the report says which fixes it would try and how long that would take)",
    )
    parser.add_argument(
        "--fix-budget",
        type=float,
        default=None,
        help="seconds of measuring per fix rung before it stops short of the precision target (default: --budget)",
    )
    parser.add_argument("--fix-json", type=Path, default=None, help="write the measured fixes as JSON here")
    add_patch_argument(parser)


def add_patch_argument(parser: argparse.ArgumentParser) -> None:
    """``--patch FILE``: the recommended fix as a diff of the script's own files (script mode only)."""
    parser.add_argument(
        "--patch",
        type=Path,
        default=None,
        metavar="FILE",
        help="with a script: write the fix the report recommends as a unified diff of the script's own files here "
        "(apply it from the script's folder with `patch -p0 < FILE`); your files are not changed",
    )


def write_patch_file(path: Path, script: str, report: Any, recorder: Any) -> None:
    """The patch of the fix ``report`` recommends, printed and written to ``path`` (``--patch``): nothing is written
    when no fix is recommended or no edit could be placed, and the printout says why."""
    from fastpipe.experiments._patch import patch_for_report

    if report is None:
        print(f"No patch written to {path}: no fix was measured.")
        return
    patch = patch_for_report(script, report, recorder)
    if patch is None:
        print(f"No patch written to {path}: no fix shortened the step beyond noise.")
        return
    print(patch.text(), end="")
    if patch.diff is None:
        print(f"No patch written to {path}: {'the fix was refused' if patch.refused else 'no edit could be placed'} (see above).")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(patch.diff)
    folder = Path(script).resolve().parent
    print(f"wrote {path}: apply it with `cd {folder} && patch -p0 < {path.resolve()}`")


def add_parser(subparsers: Any) -> None:
    from fastpipe.commands.script import add_script_arguments

    parser = subparsers.add_parser(
        "fix",
        help="measure the fixes that apply to the pipeline against the original, each input checked, and rank them",
        usage="fastpipe fix [OPTIONS] SPEC\n       fastpipe fix [OPTIONS] -- python SCRIPT [ARGS ...]   (or -m MODULE)",
    )
    add_workload_arguments(parser, spec_optional=True)
    add_measure_flags(parser, "fix rung")
    parser.add_argument("--json", type=Path, default=None, help="write the measured fixes as JSON here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the measured fixes as Markdown here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_script_arguments(parser)
    add_patch_argument(parser)
    parser.set_defaults(handler=run, fix_budget=None)


def run_fix(workload: Any, device: Any, args: argparse.Namespace, named: list[str] | None = None) -> Any:
    """Run the fix engine with the command line's settings (shared with ``diagnose --fix``)."""
    import dataclasses

    from fastpipe.experiments._fix import fix

    options = measure_options_from(args)
    if getattr(args, "fix_budget", None) is not None:
        options = dataclasses.replace(options, budget=args.fix_budget)
    return fix(workload, device=device, options=options, named=named, progress=not args.no_progress and sys.stderr.isatty())


def run(args: argparse.Namespace) -> int:
    from fastpipe.commands.script import check_no_script_options, is_script, run_script

    check_output_paths(args)  # before any work: a bad path is one line now, not a traceback after minutes of measuring
    if is_script(args):  # fastpipe fix -- python train.py: the candidates from the script's live loader, in its loop
        if args.then_continue:
            raise ConfigError("--then-continue applies to the diagnosis; fastpipe fix -- python train.py is a dry run")
        return run_script(args, fix="only")
    check_no_script_options(args)
    device, workload = workload_from_args(args)
    report = run_fix(workload, device, args)
    write_outputs(report, args)
    return 0
