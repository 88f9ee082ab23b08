"""The one reading of ``python SCRIPT ARGS`` (``fastpipe._command``) that ``fastpipe watch`` and ``fastpipe compare``
share: the same words name the same script for both, and each command keeps its own words for what to fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fastpipe.commands.watch import parse_command
from fastpipe.errors import ConfigError
from fastpipe.experiments._compare_scripts import parse_script

HERE = str(Path(__file__))


@pytest.mark.parametrize("parse", [parse_command, parse_script], ids=["watch", "compare"])
def test_both_commands_read_a_command_line_alike(parse) -> None:
    assert parse(["--", "python3", HERE, "--lr", "1"]) == ("path", HERE, ["--lr", "1"])
    assert parse([sys.executable, HERE]) == ("path", HERE, [])
    assert parse([HERE, "-b", "8"]) == ("path", HERE, ["-b", "8"])  # no interpreter named: the script comes first
    assert parse(["python", "-m", "pkg.train", "-x"]) == ("module", "pkg.train", ["-x"])
    with pytest.raises(ConfigError, match=r"^no script 'missing\.py' here \("):
        parse(["python", "missing.py"])


def test_each_command_says_what_to_fix_in_its_own_words() -> None:
    with pytest.raises(ConfigError, match="^fastpipe watch needs a script to run"):
        parse_command(["--", "python"])
    with pytest.raises(ConfigError, match="^fastpipe compare needs two scripts"):
        parse_script(["--", "python"])
    with pytest.raises(ConfigError, match=r"^fastpipe watch -- python -m needs a module name$"):
        parse_command(["python", "-m"])
    with pytest.raises(ConfigError, match=r"^`python -m` needs a module name$"):
        parse_script(["python", "-m"])
    # an option of python's where the script should be: watch names it; compare looks for it as a script, as before
    with pytest.raises(ConfigError, match=r"^fastpipe watch runs a script, not python's option '-c'"):
        parse_command(["python", "-c", "print(1)"])
    with pytest.raises(ConfigError, match=r"^no script '-c' here"):
        parse_script(["python", "-c", "print(1)"])
