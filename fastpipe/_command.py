"""A ``python SCRIPT ARGS`` command line read as ``python`` reads it, for the commands that run a user's script.

Why here, in the base layer: ``fastpipe watch`` (``commands``) and ``fastpipe compare`` of two scripts
(``experiments``) both take the command a user would type and must agree on what it names; the reading is one,
only the words of the errors are each command's own (they say how to call that command).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from fastpipe.errors import ConfigError


def parse_python_command(
    command: Sequence[str], *, no_script: str, no_module: str, an_option: str | None = None
) -> tuple[str, str, list[str]]:
    """``("path", script, args)`` or ``("module", name, args)`` from ``[--] [python] SCRIPT ARGS`` / ``-m MODULE``.

    A leading ``--`` and a leading interpreter (any word whose file name starts with ``python``, or this one) are
    dropped. The caller's words say what to fix: ``no_script`` when nothing is left, ``no_module`` for a ``-m``
    with no name, and ``an_option`` (its ``{option!r}`` replaced by the word) for an option of python's where the
    script should be; without ``an_option``, such a word is read as a script's path (and not found). A script that
    is not a file here is a :class:`~fastpipe.errors.ConfigError` that says where it was looked for.
    """
    words = list(command)
    if words and words[0] == "--":
        words.pop(0)
    if words and (Path(words[0]).name.startswith("python") or words[0] == sys.executable):
        words.pop(0)
    if not words:
        raise ConfigError(no_script)
    if words[0] == "-m":
        if len(words) < 2:
            raise ConfigError(no_module)
        return "module", words[1], words[2:]
    if an_option is not None and words[0].startswith("-"):
        raise ConfigError(an_option.format(option=words[0]))
    if not Path(words[0]).is_file():
        raise ConfigError(f"no script {words[0]!r} here ({os.getcwd()}): give its path, as to python")
    return "path", words[0], words[1:]
