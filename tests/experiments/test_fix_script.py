"""``fastpipe fix -- python train.py`` and ``diagnose -- ... --fix``: the fix engine inside a script's loop, and its pieces.

Fast: the runner seam (every rung measured by the runner given, rotated), the combined candidate built from the fixes
that helped, the command-line refusals. Slow: a torchvision-reference-style script with mixup in its ``collate_fn``
(``tests/scripts/train_photos_mixup.py``) run in-process as a user's ``fastpipe fix`` runs it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset

from fastpipe.cli import main
from fastpipe.devices import parse_device
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.diagnosis.ladder._points import PointRunner
from fastpipe.experiments._fix import NOT_TRIED, RECOMMENDED, measure_fixes
from fastpipe.experiments._fix_candidates import Candidate, build_candidates
from fastpipe.experiments._fix_combined import combine_fixes
from fastpipe.loading.recycle import RecycledLoader
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.workloads import Workload
from tests.fakes.fix import PresetTrain, corpus

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_photos_mixup.py"
requires_op = pytest.mark.skipif(not jpeg_ops.JPEG_OP_AVAILABLE, reason=jpeg_ops.jpeg_op_status())


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus(tmp_path_factory.mktemp("photos") / "corpus", n=32, classes=2)


class _Tiny(Dataset):
    def __init__(self) -> None:
        self.images = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index].float(), index % 2


def test_every_rung_is_measured_by_the_runner_given_warmed_then_rotated() -> None:
    """Script mode's seam: measure_fixes hands each rung to the runner factory (the script's WindowRunner there), the
    original's device point once, each rung's warm-up pass, then three rounds, each starting one rung later."""
    workload = Workload(loader=DataLoader(_Tiny(), batch_size=4), step=lambda b: None, name="tiny")
    same = dataclasses.replace(workload, loader=DataLoader(_Tiny(), batch_size=4), name="tiny + the same loader")
    same.loader.dataset.images = workload.loader.dataset.images  # the very same samples: the input check passes
    candidate = Candidate("the same loader", ("workers",), "", workload=same, direct=True, kind="loader", original=workload)
    asked: list[tuple[str, str]] = []

    class Counting(PointRunner):
        def measure(self, point: str, *, budget_s: float | None = None):
            asked.append((self.workload.name, point))
            return super().measure(point, budget_s=budget_s)

    options = MeasureOptions(steps=2, warmup=0, budget=0.3, precision=0.5)
    report = measure_fixes(workload, parse_device("sim:2"), options, [candidate], runner=Counting, combine=False)
    names = {"tiny": "O", "tiny + the same loader": "C"}
    sequence = [(names[w], p) for w, p in asked]
    assert sequence == [("O", "baseline"), ("C", "baseline"), ("O", "device"), *[(x, "baseline") for x in "OCCOOC"]], sequence
    result = report.results[0]
    assert result.name == "the same loader" and result.ms_per_step is not None and result.check is not None
    assert result.candidate is candidate and "candidate" not in json.loads(report.to_json())["results"][0]


@requires_op
def test_the_combined_candidate_joins_the_fixes_that_helped_and_keeps_the_loader(photos: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(str(photos), PresetTrain(32))
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=1, generator=generator, drop_last=True)
    workload = Workload(loader=loader, step=lambda b: None, name="preset")
    candidates, _ = build_candidates(workload)
    by = {c.name: c for c in candidates}
    both = by["decode only the crop (and uint8 over the copy, Normalize on the device)"]
    decode = by["decode only the crop (the same transform)"]
    recycled = by["recycled batch memory"]
    settings = Candidate(
        "num_workers 1 -> 2",
        ("workers",),
        "DataLoader(..., num_workers=2)",
        workload=dataclasses.replace(workload, loader=DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)),
        kind="settings",
    )
    gains = {both.name: 0.9, decode.name: 0.5, recycled.name: 0.1, settings.name: 0.2}
    helped = [(c, SimpleNamespace(gain=gains[c.name])) for c in (decode, both, recycled, settings)]
    combined, why = combine_fixes(workload, helped)
    assert why == "" and combined is not None
    assert combined.parts == (both.name, settings.name, recycled.name)  # the best dataset fix, not both of them
    assert isinstance(combined.loader, RecycledLoader) and combined.loader.source.num_workers == 2
    assert type(combined.dataset).__module__.startswith("fastpipe.datasets")
    assert combined.workload.device_transform is both.workload.device_transform  # its Normalize after the copy
    assert combined.loader.source.generator.initial_seed() == 3 and combined.loader.drop_last and combined.original is workload
    alone, why = combine_fixes(workload, [(decode, SimpleNamespace(gain=0.5))])
    assert alone is None and "no set of two" in why


def test_script_mode_fix_refuses_what_cannot_apply(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", "--budget-steps", "5", "--", "python", str(SCRIPT), "--data-path", "x"]) != 0
    assert "--budget-steps caps the cache ladder's steps" in capsys.readouterr().err
    assert main(["fix", "--then-continue", "--", "python", str(SCRIPT), "--data-path", "x"]) != 0
    assert "dry run" in capsys.readouterr().err
    assert main(["fix", "--loader", "2", "toy:naive"]) != 0
    assert "apply to a script" in capsys.readouterr().err


def test_patch_is_refused_where_there_is_no_script_or_no_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diff = tmp_path / "fix.diff"
    assert main(["fix", "--patch", str(diff), "toy:naive"]) != 0
    assert "--patch writes a diff of a script's own files" in capsys.readouterr().err
    assert main(["diagnose", "--patch", str(diff), "--", "python", str(SCRIPT), "--data-path", "x"]) != 0
    assert "add --fix" in capsys.readouterr().err
    assert not diff.exists()


@pytest.mark.slow
@requires_op
def test_fix_in_a_scripts_loop_keeps_its_mixup_collate_or_refuses(photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, diff = tmp_path / "fix.json", tmp_path / "fix.diff"
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    quick = ["--steps", "4", "--warmup", "1", "--budget", "3", "--precision", "0.2", "--no-progress", "--json", str(out)]
    script = ["python", str(tmp_path / SCRIPT.name), "--data-path", str(photos), "-b", "4", "--epochs", "200", "--mixup-alpha", "0.2"]
    code = main(["fix", *quick, "--patch", str(diff), "--", *script, "--step-ms", "5"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert "fastpipe fix: the candidate fixes are measured in" in captured.err
    report = json.loads(out.read_text())
    by = {r["name"]: r for r in report["results"]}
    uint8 = by["uint8 over the copy, Normalize on the device"]
    assert uint8["status"] == NOT_TRIED and "collate_fn" in uint8["why"] and "mixup/cutmix lives there" in uint8["why"]
    decode = by["decode only the crop (the same transform)"]
    assert decode["ms_per_step"] is not None and "compared before the loader's collate_fn" in decode["check"]
    assert any("every rung ran inside" in note for note in report["notes"])
    assert ("Recommended:" in captured.out) == any(r["status"] == RECOMMENDED for r in report["results"])
    # --patch: the recommended fix as a diff of the script's copy (which is left as it was), or why there is none
    assert (tmp_path / SCRIPT.name).read_text() == SCRIPT.read_text()
    if diff.exists():
        assert f"Patch for: {report['best']}" in captured.out and "collate_fn=collate_fn" in diff.read_text()
        if shutil.which("patch"):
            applied = subprocess.run(["patch", "-p0", "--dry-run"], input=diff.read_text(), text=True, capture_output=True, cwd=tmp_path)
            assert applied.returncode == 0, applied.stdout + applied.stderr
    else:
        assert "No patch written" in captured.out or "no diff:" in captured.out, captured.out[-2000:]


def test_script_mode_offers_each_worker_count_keeping_the_loaders_settings() -> None:
    from fastpipe.experiments._fix_candidates import WORKERS_DRAW, worker_count_candidates

    def collate(batch):
        return batch

    loader = DataLoader(_Tiny(), batch_size=4, num_workers=2, collate_fn=collate, persistent_workers=True, pin_memory=True)
    workload = Workload(loader=loader, step=lambda b: None, name="tiny")
    offered = worker_count_candidates(workload, [1, 2, 4])
    assert [c.name for c in offered] == ["num_workers 2 -> 1", "num_workers 2 -> 4"]
    for candidate in offered:
        assert candidate.not_tried is None and candidate.kind == "settings" and candidate.compare_pixels == WORKERS_DRAW
        assert candidate.loader.collate_fn is collate and candidate.loader.persistent_workers and candidate.loader.pin_memory


@pytest.mark.slow
@requires_op
def test_diagnose_fix_in_a_script_measures_the_fixes_after_the_ladder(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fixes.json"
    quick = ["--no-memory", "--no-stage-costs", "--no-startup", "--steps", "4", "--warmup", "1", "--precision", "0.2", "--budget", "3"]
    script = ["python", str(SCRIPT), "--data-path", str(photos), "-b", "4", "--epochs", "300", "--step-ms", "5"]
    code = main(["diagnose", *quick, "--no-progress", "--fix", "--fix-json", str(out), "--", *script])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert "fastpipe diagnosis:" in captured.out and "fastpipe fix " in captured.out  # the ladder's table, then the fixes'
    report = json.loads(out.read_text())
    assert report["schema"] == "fastpipe.fix/1" and any(r["ms_per_step"] is not None for r in report["results"])
    assert report["named_stages"] is not None  # the stages the ladder named were passed on
