"""Every ``--json``, ``--markdown`` and ``--plot`` path is checked before the work (issue 33, item 9).

A folder given as ``--json`` gave a traceback after minutes of measuring, and the files after it were never
written. Each command that writes one is found from the parser itself, so a new command is covered or named here.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pytest

from fastpipe.cli import build_parser, main

OUTPUT_OPTIONS = ("json", "markdown", "plot")

FACTORY = """
import pathlib
import torch
from torch.utils.data import DataLoader

def make():
    pathlib.Path({marker!r}).write_text("the factory ran")
    return DataLoader(torch.zeros(8, 2), batch_size=2), lambda batch: None
"""

_names = itertools.count()


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _commands_with_outputs() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for name, command in sub.choices.items():
        options = {o for o in OUTPUT_OPTIONS for a in command._actions if _flag(o) in a.option_strings}
        if options:
            found[name] = options
    return found


def _argv(command: str, spec: str, script: Path, output: list[str]) -> list[str]:
    """The command's own arguments, with a SPEC (or script) that says when the work began; ``output`` first."""
    words = {
        "diagnose": ["diagnose", spec, "--device", "sim:1"],
        "fix": ["fix", spec, "--device", "sim:1"],
        "compare": ["compare", spec, spec, "--device", "sim:1"],
        "costs": ["costs", spec, "--device", "sim:1"],
        "tune": ["tune", spec, "--device", "sim:1"],
        "memory": ["memory", spec, "--device", "sim:1"],
        "watch": ["watch", "--", "python", str(script)],
    }[command]
    return [words[0], *output, *words[1:]]


CASES = [(c, o) for c, options in sorted(_commands_with_outputs().items()) for o in sorted(options)]


def test_every_command_that_writes_outputs_is_covered() -> None:
    assert {c for c, _ in CASES} == {"diagnose", "fix", "compare", "costs", "tune", "memory", "watch"}, "add the new command to _argv"


@pytest.mark.parametrize("bad", ["folder", "under_a_file"])
@pytest.mark.parametrize("command, option", CASES)
def test_a_bad_output_path_is_one_line_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, option: str, bad: str
) -> None:
    marker = tmp_path / "work_began"
    module = f"outputs_factory_{next(_names)}"
    (tmp_path / f"{module}.py").write_text(FACTORY.format(marker=str(marker)))
    script = tmp_path / "train.py"
    script.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('the script ran')\n")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("mine")
    path = tmp_path / "a_folder" if bad == "folder" else tmp_path / "a_file" / "out"
    monkeypatch.chdir(tmp_path)
    assert main(_argv(command, f"{module}:make", script, [_flag(option), str(path)])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fastpipe: error: {_flag(option)} ") and "\n" not in err, err
    assert not marker.exists(), "the check came after the work had begun"
    assert (tmp_path / "a_file").read_text() == "mine" and not any((tmp_path / "a_folder").iterdir())


def test_two_outputs_on_one_file_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "same")
    assert main(["diagnose", "toy:naive", "--json", path, "--markdown", path]) == 2
    assert "are the same file" in capsys.readouterr().err
