"""Every report table shown in the documentation has the columns the code prints today.

A page that shows a report copies it once, and the code's columns then move on without it (the report's
``added ms`` column became ``stage added | its ms``, and Getting started kept teaching the old one). So each
table in ``docs/`` and the README whose header looks like a report's, a Markdown table (``--markdown``) or a
console table in a fenced block (rich's ``┃`` header), must have exactly the header of the class that prints
it, and every row as many cells. The headers are read from the classes (``Report.HEADERS``,
``Comparison.HEADERS``), never copied here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import fastpipe
from tests.fakes.docs_blocks import ROOT, pages

#: Each kind of table the docs show: the header cell that starts it, and the headers its class may print.
KINDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "report": (tuple(fastpipe.Report.HEADERS),),
    "comparison": (tuple(fastpipe.Comparison.HEADERS), tuple(fastpipe.Comparison.MEMORY_HEADERS)),
}
FIRST_CELL = {headers[0]: kind for kind, options in KINDS.items() for headers in options}

RICH_HEAD = "┃"
RICH_ROW = "│"
CUT = "..."  # a page may cut a table's rows (never its columns) with a line of its own
SEPARATOR = re.compile(r"^\|\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


@dataclass(frozen=True)
class Table:
    """A table found on a page: where its header is, its header cells and each row's cell count."""

    line: int  # 1-based
    header: tuple[str, ...]
    row_widths: tuple[int, ...]


def _cells(line: str, bar: str) -> list[str]:
    parts = line.strip().split(bar)
    if parts and not parts[0].strip():
        parts = parts[1:]
    if parts and not parts[-1].strip():
        parts = parts[:-1]
    return [part.strip() for part in parts]


def tables(text: str) -> list[Table]:
    """The Markdown tables (a header row, then ``|---|``) and the rich console tables (``┃`` header rows, a header
    that wraps joined cell by cell) of a page, code blocks included: a pasted console report is in one. A ``...``
    line among the rows is a cut, not the table's end."""
    lines = text.split("\n")
    found: list[Table] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|") and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1].strip()):
            header = tuple(_cells(line, "|"))
            end = i + 2
            while end < len(lines) and (lines[end].strip().startswith("|") or lines[end].strip() == CUT):
                end += 1
            widths = tuple(len(_cells(row, "|")) for row in lines[i + 2 : end] if row.strip() != CUT)
            found.append(Table(i + 1, header, widths))
            i = end
            continue
        if line.startswith(RICH_HEAD):
            start, parts = i, []
            while i < len(lines) and lines[i].strip().startswith(RICH_HEAD):
                parts.append(_cells(lines[i], RICH_HEAD))
                i += 1
            header = tuple(" ".join(p[k] for p in parts if k < len(p) and p[k]).strip() for k in range(len(parts[0])))
            widths = []
            while i < len(lines) and (lines[i].strip()[:1] in (RICH_ROW, "├", "┡", "└", "╇") or lines[i].strip() == CUT):
                if lines[i].strip().startswith(RICH_ROW):
                    widths.append(len(_cells(lines[i], RICH_ROW)))
                i += 1
            found.append(Table(start + 1, header, tuple(widths)))
            continue
        i += 1
    return found


def drifted(text: str, where: str) -> list[str]:
    """What in ``text`` shows a report's table with a header (or a row) the code no longer prints."""
    problems = []
    for table in tables(text):
        kind = FIRST_CELL.get(table.header[0]) if table.header else None
        if kind is None:
            continue
        options = KINDS[kind]
        if table.header not in options:
            expected = " | ".join(min(options, key=lambda h: len(set(h) ^ set(table.header))))
            problems.append(f"{where}:{table.line}: a {kind} table headed '{' | '.join(table.header)}'; the code prints '{expected}'")
            continue
        for n, width in enumerate(table.row_widths, 1):
            if width != len(table.header):
                problems.append(f"{where}:{table.line}: row {n} of a {kind} table has {width} cells, its header {len(table.header)}")
    return problems


def _shown(path: Path) -> int:
    return sum(1 for t in tables(path.read_text()) if t.header and t.header[0] in FIRST_CELL)


@pytest.mark.parametrize("path", pages(), ids=[str(p.relative_to(ROOT)) for p in pages()])
def test_every_report_table_has_the_header_the_code_prints(path: Path) -> None:
    problems = drifted(path.read_text(), str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


def test_the_docs_show_report_tables_at_all() -> None:
    # the check above would pass on a site that shows none, or whose tables it no longer recognizes
    assert sum(_shown(path) for path in pages()) >= 3


def test_a_drifted_header_and_a_short_row_are_caught() -> None:
    report = " | ".join(fastpipe.Report.HEADERS)
    old = "| cache point | ms/step | added ms | steps/s | of device bound | precision | CPU |\n|---|---:|---:|---:|---:|---:|---:|\n| host | 43 | +3 | 23 | 92% | ±0% | 1% |\n"
    assert drifted(old, "page") == [f"page:1: a report table headed '{old.splitlines()[0][2:-2]}'; the code prints '{report}'"]
    short = f"| {report} |\n|---|---|\n| device (bound) | 40 |\n"
    assert drifted(short, "page") == [f"page:1: row 1 of a report table has 2 cells, its header {len(fastpipe.Report.HEADERS)}"]
    cut = f"| {report} |\n|---|---|\n| device (bound) | 40 |  |  | 25.000 | 100.0% | ±0.0% | 2% |\n...\n| baseline | 112 |\n"
    assert drifted(cut, "page") == [f"page:1: row 2 of a report table has 2 cells, its header {len(fastpipe.Report.HEADERS)}"]
    columns = "| column | what it says |\n|---|---|\n| cache point | what is cached |\n"
    assert drifted(columns, "page") == []  # a table about the columns is not a report's


def test_a_console_table_is_read_with_its_wrapped_header() -> None:
    from fastpipe._render import render_table

    headers = fastpipe.Report.HEADERS
    text = render_table("title", [(h, "right") for h in headers], [tuple("x" for _ in headers)], width=90)
    assert len([line for line in text.splitlines() if line.startswith(RICH_HEAD)]) > 1  # a header on two lines
    assert [(t.header, t.row_widths) for t in tables(text)] == [(tuple(headers), (len(headers),))]
    assert drifted(text.replace(f" {headers[3]} ", f" {'x' * len(headers[3])} "), "console")
