"""``fastpipe prepare SOURCE TARGET``: a copy of an image folder whose progressive JPEGs are baseline, pixels identical."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prepare", help="copy an image folder with progressive JPEGs rewritten as baseline (lossless), the rest hard-linked"
    )
    parser.add_argument("source", type=Path, help="the image folder (class folders of files)")
    parser.add_argument("target", type=Path, help="a new folder for the prepared copy")
    parser.add_argument("--restart-rows", type=int, default=0, help="add a restart marker every N MCU rows (off: measure first)")
    parser.add_argument("--no-measure", action="store_true", help="skip timing decode-and-crop on the rewritten files before and after")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fastpipe.datasets.prepare import prepare_folder

    report = prepare_folder(args.source, args.target, restart_rows=args.restart_rows, measure=not args.no_measure)
    print(report.summary())
    return 0
