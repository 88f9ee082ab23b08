"""The ``fastpipe`` command line. Each subcommand lives in its own module under fastpipe/commands.

Errors a user can cause (FastpipeError) become one line on stderr and exit code 2, never a
traceback; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from fastpipe.errors import FastpipeError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _subcommand_modules() -> list[Any]:
    from fastpipe.commands import compare, costs, diagnose, fix, memory, prepare, run, tune, watch

    return [diagnose, fix, compare, costs, memory, tune, run, watch, prepare]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastpipe", description="Find and fix GPU starvation in PyTorch input pipelines.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _subcommand_modules():
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except FastpipeError as exc:
        print(f"fastpipe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fastpipe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
