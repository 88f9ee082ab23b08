"""The first-diagnosis example (examples/first_diagnosis): both scripts load as fastpipe SPECs from their folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fastpipe.workloads._workload import load_workload

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "first_diagnosis"


@pytest.fixture
def in_example(tmp_path, monkeypatch):
    photos = pytest.importorskip("fastpipe.workloads.photos")
    pytest.importorskip("skimage", reason="the example's photos need fastpipe[photos]")
    monkeypatch.setenv("PHOTOS", str(photos.build_corpus(root=tmp_path / "photos", n=24)))
    monkeypatch.chdir(EXAMPLE)
    yield
    for name in ("train", "train_fast"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("spec", ["train:make_workload", "train_fast:make_workload"])
def test_the_example_scripts_are_specs_run_from_their_folder(in_example, spec: str) -> None:
    workload = load_workload(spec, "sim:50")
    images, labels = next(iter(workload.loader))
    assert images.shape[1:] == (3, 224, 224) and labels.shape == (images.shape[0],)
    assert images.dtype == (torch.float32 if spec.startswith("train:") else torch.uint8)
