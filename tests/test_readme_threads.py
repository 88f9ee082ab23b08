"""The README's "Thread loader" and "fastpipe prepare" sections: their Python blocks run, in order, as printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_readme_watch import blocks, run_section

pytest.importorskip("fastpipe._jpeg", reason="the sections use the JPEG op: build it with setup.py build_ext")


def test_thread_loader_and_prepare_sections_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_section("Thread loader", tmp_path, monkeypatch, diagnose=False)
    assert namespace["loader"].fast() and namespace["loader"].stats()["batches"] == 2
    for code in blocks("fastpipe prepare"):  # on the folder the first section made
        exec(compile(code, "README:fastpipe prepare", "exec"), namespace)
    assert (namespace["report"].changed, namespace["report"].files) == (4, 8)
