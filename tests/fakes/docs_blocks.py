"""The Python blocks of the documentation pages and the README, read as the docs test runs them.

A page is MyST Markdown. Its ```` ```python ```` blocks are grouped by section (the page's `##` heading, or its
title before the first one). A block runs unless the line before it says otherwise, in an HTML comment that
neither Sphinx nor GitHub shows:

- ``<!-- docs-test: not run: REASON -->``: it cannot run here (GPU only, needs a cluster, a fragment of your code);
- ``<!-- docs-test: slow: REASON -->``: it runs, but only with the slow tests (``make test-all``).

A section that builds on an earlier one of the same page says so under its heading with
``<!-- docs-test: after SECTION -->``: its blocks then run after that section's, in the same namespace.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

MARK = re.compile(r"^<!-- docs-test: (not run|slow): (\S.*?) -->$")
AFTER = re.compile(r"^<!-- docs-test: after (\S.*?) -->$")
ANY_MARK = re.compile(r"^\s*<!-- docs-test:")
FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*(.*)$")  # indented too: a block inside a list item
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
# Fences that hold Python under another name would escape the collector: the pages use ```python only.
OTHER_PYTHON = re.compile(r"^(py|python3|pycon|ipython|\{code-block\}\s+py\w*|\{code\}\s+py\w*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block of Python: where it is, its code, and whether (and why not) it runs."""

    page: Path
    section: str
    line: int  # the line of its first line of code, 1-based
    code: str
    mark: str | None = None  # None (runs), "not run" or "slow"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class Section:
    page: Path
    title: str
    blocks: list[Block] = field(default_factory=list)
    after: str | None = None

    @property
    def key(self) -> str:
        return f"{self.page.relative_to(ROOT)}::{self.title}"


@dataclass
class Page:
    path: Path
    sections: list[Section]
    problems: list[str]  # fences and marks the collector refuses, with where they are
    headings: list[str]  # every heading's text, for anchors


def pages() -> list[Path]:
    """Every Markdown page of the site, and the README."""
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts) + [README]


def read_page(path: Path) -> Page:
    """The page's sections and their Python blocks, and what in it breaks the rules above."""
    lines = path.read_text().split("\n")
    sections = [Section(path, path.stem)]
    problems: list[str] = []
    headings: list[str] = []
    pending: tuple[str, str, int] | None = None  # a mark waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            indent, ticks, info = len(fence.group(1)), fence.group(2), fence.group(3).strip()
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(ticks) and not lines[j].strip().strip(ticks[0])), None
            )
            if end is None:
                problems.append(f"{path.relative_to(ROOT)}:{i + 1}: a fence that never closes")
                break
            if info == "python":
                mark, reason = (pending[0], pending[1]) if pending else (None, "")
                code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
                sections[-1].blocks.append(Block(path, sections[-1].title, i + 2, code, mark, reason))
            elif OTHER_PYTHON.match(info):
                problems.append(f"{path.relative_to(ROOT)}:{i + 1}: write Python blocks as ```python (found {info!r})")
            elif pending:
                problems.append(f"{path.relative_to(ROOT)}:{pending[2]}: a docs-test mark before a {info or 'plain'} block")
            pending = None
            i = end + 1
            continue
        heading = HEADING.match(line)
        if heading:
            title = heading.group(2)
            headings.append(title)
            if len(heading.group(1)) <= 2:
                if len(heading.group(1)) == 2 or len(sections) > 1 or sections[0].blocks:
                    sections.append(Section(path, title))
                else:
                    sections[0].title = title
        elif MARK.match(line.strip()):
            if pending:
                problems.append(f"{path.relative_to(ROOT)}:{pending[2]}: a docs-test mark with no block after it")
            pending = (MARK.match(line.strip()).group(1), MARK.match(line.strip()).group(2), i + 1)
        elif AFTER.match(line.strip()):
            sections[-1].after = AFTER.match(line.strip()).group(1)
        elif ANY_MARK.match(line):
            problems.append(f"{path.relative_to(ROOT)}:{i + 1}: not a docs-test mark this test knows: {line.strip()}")
        elif line.strip() and pending:
            problems.append(f"{path.relative_to(ROOT)}:{pending[2]}: a docs-test mark not right before a ```python block")
            pending = None
        i += 1
    if pending:
        problems.append(f"{path.relative_to(ROOT)}:{pending[2]}: a docs-test mark with no block after it")
    return Page(path, [s for s in sections if s.blocks or s.after], problems, headings)


def all_sections() -> list[Section]:
    return [section for path in pages() for section in read_page(path).sections]


def missing_imports(code: str) -> list[str]:
    """The top-level packages this code imports that are not installed (its section is skipped, naming them)."""
    missing = []
    for node in ast.walk(ast.parse(code)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if importlib.util.find_spec(top) is None and top not in missing:
                missing.append(top)
    return missing


def slug(title: str) -> str:
    """The anchor MyST (``myst_heading_anchors``) and GitHub give a heading: GitHub's rule, on the heading's text."""
    text = re.sub(r"[`*]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title))
    return re.sub(r"[^\w\u4e00-\u9fff\- ]", "", text.lower().replace(" ", "-"))
