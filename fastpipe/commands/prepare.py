"""``fastpipe prepare SOURCE TARGET``: a copy of an image folder whose progressive JPEGs are baseline, pixels identical.

Exit status: 0 when every file is in place, 1 when some progressive files could not be rewritten (each is named;
they are kept as they are), 2 for a bad argument or target (one line), 130 on Ctrl-C (the partial copy is kept
beside the target, and the same command resumes it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED_FILES = 1
#: Failed files named one per line; the rest counted.
SHOWN_FAILURES = 20


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prepare", help="copy an image folder with progressive JPEGs rewritten as baseline (lossless), the rest hard-linked"
    )
    parser.add_argument("source", type=Path, help="the image folder (class folders of files)")
    parser.add_argument("target", type=Path, help="a new folder for the prepared copy (outside the source)")
    parser.add_argument(
        "--restart-rows", type=int, default=0, help="add a restart marker every N MCU rows, 0 to 65535 (default 0, none: measure first)"
    )
    parser.add_argument("--no-measure", action="store_true", help="skip timing decode-and-crop on the rewritten files before and after")
    parser.set_defaults(handler=run)


def _progress(done: int, total: int) -> None:
    if done == total or done % 100 == 0:
        print(f"\rprepare: {done} of {total} files", end="\n" if done == total else "", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from fastpipe.datasets._prepare_tree import partial_folder
    from fastpipe.datasets.prepare import prepare_folder

    try:  # prepare_folder checks its options and the target before it reads a file
        report = prepare_folder(
            args.source,
            args.target,
            restart_rows=args.restart_rows,
            measure=not args.no_measure,
            progress=_progress if sys.stderr.isatty() else None,
        )
    except KeyboardInterrupt:
        partial = partial_folder(args.target)
        if partial.exists():
            print(
                f"\nfastpipe prepare: interrupted; {args.target} was not made. The files done so far are in {partial}: "
                "run the same command again to resume, or delete that folder",
                file=sys.stderr,
            )
        raise
    print(report.summary())
    if report.failed:
        print(
            f"fastpipe prepare: {len(report.failed)} progressive file(s) could not be rewritten and were kept as they are:", file=sys.stderr
        )
        for line in report.failed[:SHOWN_FAILURES]:
            print(f"  {line}", file=sys.stderr)
        if len(report.failed) > SHOWN_FAILURES:
            print(f"  ... and {len(report.failed) - SHOWN_FAILURES} more", file=sys.stderr)
        return EXIT_FAILED_FILES
    return 0
