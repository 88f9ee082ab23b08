"""The README's watch, Lightning, Hugging Face and streaming sections: their Python blocks run, in order, as printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(section: str) -> list[str]:
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def run_section(section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, diagnose: bool) -> dict:
    monkeypatch.chdir(tmp_path)  # the HF example writes its output_dir here
    namespace: dict = {"__name__": "__readme__"}
    found = blocks(section)
    assert found, section
    for code in found:
        if "diagnose(" in code and not diagnose:
            continue
        exec(compile(code, f"README:{section}", "exec"), namespace)
    return namespace


def test_watch_section_runs(tmp_path, monkeypatch) -> None:
    namespace = run_section("Is my GPU waiting? (watch)", tmp_path, monkeypatch, diagnose=False)
    assert namespace["batches"].summary()["steps"] == 16


def test_lightning_section_runs(tmp_path, monkeypatch) -> None:
    pytest.importorskip("lightning")
    namespace = run_section("In Lightning", tmp_path, monkeypatch, diagnose=False)
    assert "fastpipe/input_bound_share" in namespace["trainer"].callback_metrics


def test_hf_section_runs(tmp_path, monkeypatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    namespace = run_section("In the Hugging Face Trainer", tmp_path, monkeypatch, diagnose=False)
    assert namespace["callback"].watch.summary()["steps"] == 16


def test_streaming_section_runs(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("webdataset")
    namespace = run_section("Streaming datasets", tmp_path, monkeypatch, diagnose=False)
    images, labels = next(iter(namespace["loader"]))
    assert images.shape == (8, 3, 96, 128) and len(labels) == 8
    printed = capsys.readouterr().out
    assert "['decode', 'augment', 'to_tensor', 'batched']" in printed and "['strip', 'split']" in printed


@pytest.mark.slow
@pytest.mark.parametrize(
    "section, package",
    [("In Lightning", "lightning"), ("In the Hugging Face Trainer", "transformers"), ("Streaming datasets", "webdataset")],
)
def test_sections_with_their_diagnosis_run(tmp_path, monkeypatch, section, package) -> None:
    pytest.importorskip(package)
    namespace = run_section(section, tmp_path, monkeypatch, diagnose=True)
    assert namespace["report"].experiments
    if section == "Streaming datasets":  # the printed comment says it names augment
        assert [b.stage for b in namespace["report"].bottlenecks][:1] == ["augment"], namespace["report"].to_table()
