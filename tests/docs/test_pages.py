"""The documentation is tested: its Python runs, its links resolve, its command-line page has every subcommand.

Every ```` ```python ```` block of the pages in ``docs/`` and of the README runs here, the blocks of a section in
order in one namespace, in a fresh folder (``tests/fakes/docs_blocks.py`` says how a block is marked not run or slow,
and why). Some sections also check what their blocks made or printed (``CHECKS``). The Sphinx build itself,
with warnings as errors, runs with the slow tests when Sphinx is installed (``pip install 'fastpipe[docs]'``).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.fakes.docs_blocks import DOCS, README, ROOT, Section, all_sections, missing_imports, pages, read_page, slug

sys.path.insert(0, str(DOCS / "_ext"))
from cli_text import help_text, subcommands  # noqa: E402  (docs/_ext is not a package)

SECTIONS = all_sections()
BY_KEY = {section.key: section for section in SECTIONS}


def _watch(ns: dict, out: str) -> None:
    assert ns["batches"].summary()["steps"] == 16  # 2 epochs of 512 samples in batches of 64


def _lightning(ns: dict, out: str) -> None:
    assert "fastpipe/input_bound_share" in ns["trainer"].callback_metrics
    if "report" in ns:
        assert ns["report"].experiments


def _hf(ns: dict, out: str) -> None:
    assert ns["callback"].watch.summary()["steps"] == 16
    if "report" in ns:
        assert ns["report"].experiments


def _streaming(ns: dict, out: str) -> None:
    images, labels = next(iter(ns["loader"]))
    assert images.shape == (8, 3, 96, 128) and len(labels) == 8
    assert "['decode', 'augment', 'to_tensor', 'batched']" in out and "['strip', 'split']" in out  # as printed in the page
    if "report" in ns:  # the page's comment says it names augment
        assert [b.stage for b in ns["report"].bottlenecks][:1] == ["augment"], ns["report"].to_table()


def _thread_loader(ns: dict, out: str) -> None:
    assert ns["loader"].fast() and ns["loader"].stats()["batches"] == 2  # 8 photos in batches of 4


def _prepare(ns: dict, out: str) -> None:
    assert (ns["report"].changed, ns["report"].files) == (4, 8)  # the 4 progressive photos of 8 rewritten


def _startup(ns: dict, out: str) -> None:
    startup = ns["startup"]  # the page says the parts add up to the wait, and persistent workers are a fix here
    assert abs(sum(seconds for _, seconds in startup.parts) - startup.first_batch_s) <= 0.01 * startup.first_batch_s + 1e-3
    assert "persistent_workers=True" in [fix.name for fix in startup.fixes]


def _streams(ns: dict, out: str) -> None:
    assert (ns["check"].duplicated, ns["check"].drawn) == (64, 64)  # 2 workers, each the whole 64-item stream, 32 drawn each
    assert not ns["sharded"].duplicates and ns["sharded"].drawn == 64


CHECKS: dict[str, Callable[[dict, str], None]] = {
    "docs/watch.md::Is my GPU waiting? (watch)": _watch,
    "docs/diagnose-lightning.md::Diagnose in Lightning": _lightning,
    "docs/diagnose-hf.md::Diagnose in the Hugging Face Trainer": _hf,
    "docs/diagnose-streams.md::Diagnose a stream (WebDataset, IterableDataset)": _streaming,
    "docs/thread-loader.md::ThreadLoader": _thread_loader,
    "docs/thread-loader.md::fastpipe prepare": _prepare,
    "docs/unseen.md::Start-up": _startup,
    "docs/unseen.md::Streams that repeat themselves": _streams,
}


PRINTED = re.compile(r"^\s*print\(.*\)\s+# (\[[^\]]*\]|True|False|None)(?=$|:)", flags=re.M)


def printed_claims(code: str) -> list[str]:
    """What a block says it prints: ``print(x)  # ['a', 'b']`` (a list, True, False or None) is checked against the output."""
    return PRINTED.findall(code)


def run_section(section: Section, slow: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> dict:
    """Run the section's blocks (and those of the section it builds on) as printed; return their namespace."""
    chain = [section]
    while chain[0].after:
        chain.insert(0, BY_KEY[f"{section.page.relative_to(ROOT)}::{chain[0].after}"])
    runs = [b for s in chain for b in s.blocks if b.mark is None or (slow and b.mark == "slow")]
    missing = sorted({name for block in runs for name in missing_imports(block.code)})
    if missing:
        pytest.skip(f"{section.key} needs {', '.join(missing)} (not installed)")
    monkeypatch.chdir(tmp_path)  # the examples write their files here (the HF trainer's output_dir, photos)
    namespace: dict = {"__name__": "__docs__"}
    for block in runs:
        # padded so that a traceback's line number is the page's
        exec(compile("\n" * (block.line - 1) + block.code, str(block.page), "exec"), namespace)
    out = capsys.readouterr().out
    for block in runs:
        for claim in printed_claims(block.code):
            assert claim in out, f"{block.where} says it prints {claim}; it printed:\n{out[-2000:]}"
    if section.key in CHECKS:
        CHECKS[section.key](namespace, out)
    return namespace


def _ids(sections: list[Section]) -> list[str]:
    return [s.key for s in sections]


FAST = [s for s in SECTIONS if any(b.mark is None for b in s.blocks)]
SLOW = [s for s in SECTIONS if any(b.mark == "slow" for b in s.blocks)]


@pytest.mark.parametrize("section", FAST, ids=_ids(FAST))
def test_section_runs(section: Section, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    run_section(section, False, tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("section", SLOW, ids=_ids(SLOW))
def test_section_with_its_slow_blocks_runs(section: Section, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    run_section(section, True, tmp_path, monkeypatch, capsys)


def test_every_python_block_runs_or_says_why_not() -> None:
    problems = [problem for path in pages() for problem in read_page(path).problems]
    assert not problems, "\n".join(problems)
    blocks = [b for s in SECTIONS for b in s.blocks]
    assert blocks and all(b.mark is None or b.reason.strip() for b in blocks)
    assert all(s.key in BY_KEY for s in SECTIONS)
    for section in SECTIONS:  # a section that builds on another names one that exists on its page
        if section.after:
            assert f"{section.page.relative_to(ROOT)}::{section.after}" in BY_KEY, section.key
    for key in CHECKS:  # a check whose section was renamed or lost its runnable blocks would never run
        assert key in {s.key for s in FAST}, f"CHECKS names {key}, which has no block that runs"


def test_a_printed_claim_is_read_from_the_comment() -> None:
    code = "print(x)  # ['a', 'b']\nprint(ok)  # True: all of it\nprint(y)  # a sentence, not checked\nx = 1  # [1]\n"
    assert printed_claims(code) == ["['a', 'b']", "True"]


def test_the_collector_refuses_what_would_escape_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.fakes.docs_blocks.ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```py\nprint(1)\n```\n\n<!-- docs-test: not run: GPU only -->\n\n```bash\nls\n```\n\n"
        "<!-- docs-test: skip -->\n```python\nprint(2)\n```\n\n## Two\n\n<!-- docs-test: slow: long -->\n```python\nprint(3)\n```\n"
        "\n1. In a list:\n\n   ```python\n   print(4)\n   ```\n"
    )
    found = read_page(page)
    assert [p.split(": ", 1)[1] for p in found.problems] == [
        "write Python blocks as ```python (found 'py')",
        "a docs-test mark before a bash block",
        "not a docs-test mark this test knows: <!-- docs-test: skip -->",
    ]
    assert [(s.title, [(b.mark, b.reason, b.line) for b in s.blocks]) for s in found.sections] == [
        ("Page", [(None, "", 15)]),
        ("Two", [("slow", "long", 22), (None, "", 28)]),
    ]
    assert found.sections[1].blocks[1].code == "print(4)\n"  # dedented, as it runs


LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    text = re.sub(r"(`{3,}).*?\1", "", path.read_text(), flags=re.S)  # not inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("path", pages(), ids=[str(p.relative_to(ROOT)) for p in pages()])
def test_links_resolve(path: Path) -> None:
    broken = []
    for target in _links(path):
        if re.match(r"^[a-z]+:", target):  # http:, mailto:: not fetched (no network here)
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in {slug(h) for h in read_page(resolved).headings}:
            broken.append(f"{target}: no heading with the anchor #{anchor} in {resolved.name}")
    assert not broken, f"{path.relative_to(ROOT)}:\n" + "\n".join(broken)


def _toctree_entries(page: Path) -> set[Path]:
    entries = set()
    for body in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), flags=re.S):
        for line in body.splitlines():
            if line.strip() and not line.startswith(":"):
                entries.add((page.parent / f"{line.strip()}.md").resolve())
    return entries


def test_every_page_is_in_the_navigation() -> None:
    listed = {(DOCS / "index.md").resolve()}
    for page in DOCS.rglob("*.md"):
        listed |= _toctree_entries(page)
    site = {p.resolve() for p in pages() if p != README}
    assert site - listed == set(), "pages in no toctree"
    assert listed - site == set(), "toctree entries with no page"


def test_the_command_line_page_has_every_subcommand_from_its_parser() -> None:
    text = (DOCS / "cli.md").read_text()
    names = subcommands()
    assert "diagnose" in names and "watch" in names
    for name in names:
        assert re.search(rf"^## fastpipe {name}\n(?:.*\n)*?```{{fastpipe-cli}} {name}\n```$", text, flags=re.M), (
            f"docs/cli.md has no section for `fastpipe {name}`: add '## fastpipe {name}' and its {{fastpipe-cli}} {name} block"
        )
        assert help_text(name).startswith(f"usage: fastpipe {name}")
    with pytest.raises(ValueError, match="no subcommand 'nope'"):
        help_text("nope")


def test_the_readme_is_a_landing_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md is {len(lines)} lines: move the detail into docs/"
    assert any("docs/index.md" in line for line in lines)


SPHINX = all(importlib.util.find_spec(name) for name in ("sphinx", "myst_parser", "furo"))


@pytest.mark.slow
@pytest.mark.skipif(not SPHINX, reason="the docs extra is not installed: pip install 'fastpipe[docs]'")
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "cli.html").read_text().count("usage: fastpipe") >= len(subcommands())
    assert (tmp_path / "_images" / "diagnose_toy_naive.png").exists()
