"""The ``--help`` text of ``fastpipe`` and each of its subcommands, from the parsers themselves (no Sphinx needed).

``cli_help.py`` puts it in the pages at build time; ``tests/docs/test_pages.py`` checks that the command-line page has a
section for every subcommand the parser has, so a new subcommand cannot go undocumented.
"""

from __future__ import annotations

import argparse
import os

HELP_COLUMNS = "82"  # argparse wraps to $COLUMNS: fixed (a build does not depend on the terminal), and fits furo's column


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand, by name, in the order ``fastpipe --help`` lists them."""
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def subcommands() -> list[str]:
    """The names of ``fastpipe``'s subcommands."""
    from fastpipe.cli import build_parser

    return list(subcommand_parsers(build_parser()))


def help_text(command: str | None) -> str:
    """``fastpipe [COMMAND] --help`` as the parser prints it, wrapped at ``HELP_COLUMNS``."""
    from fastpipe.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser()
        if not command:
            return parser.format_help()
        parsers = subcommand_parsers(parser)
        if command not in parsers:
            raise ValueError(f"fastpipe has no subcommand {command!r}; it has {', '.join(parsers)}")
        return parsers[command].format_help()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
