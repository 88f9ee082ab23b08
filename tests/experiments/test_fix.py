"""fastpipe fix / diagnose --fix: candidates measured against the original in one run (slow: each runs many rungs).

The planted costs are large against the noise of a loaded 2-core machine: a full JPEG decode of ImageNet-sized
photos for a 32-pixel crop (about twice what decoding only the crop costs), against a 5 ms simulated step; where nothing
can help, the pipeline costs a few milliseconds of a 200 ms step (a saving under 5% of the device step does not count).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torchvision
import torchvision.transforms as v1
from torch.utils.data import DataLoader, Dataset

from fastpipe.cli import main
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.experiments._fix import NOT_HELPING, RECOMMENDED, fix, run_fix
from fastpipe.experiments._fix_candidates import build_candidates
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.workloads import Workload
from tests.fakes.fix import MEAN, STD, PresetTrain, corpus

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not jpeg_ops.JPEG_OP_AVAILABLE, reason=jpeg_ops.jpeg_op_status())]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus(tmp_path_factory.mktemp("photos") / "corpus", n=24)


def _preset_workload(root: Path) -> Workload:
    """No workers: the decode runs in the loop's process, without the noise of worker hand-offs on a loaded machine."""
    dataset = torchvision.datasets.ImageFolder(str(root), PresetTrain(32))
    return Workload(loader=DataLoader(dataset, batch_size=8, shuffle=True, num_workers=0), step=lambda b: None, name="preset")


def test_decode_the_crop_is_measured_faster_beyond_noise_and_its_input_checked(photos: Path) -> None:
    workload = _preset_workload(photos)
    candidates, _ = build_candidates(workload)
    decode = [c for c in candidates if c.name == "decode only the crop (the same transform)"]
    report = run_fix(workload, "sim:5", MeasureOptions(steps=5, warmup=1, budget=9.0), candidates=decode)
    assert [r.status for r in report.results] == [RECOMMENDED], report.to_table()
    best = report.recommended[0]
    assert best.gain > 0.2 and best.ms_per_step < best.original_ms
    assert "labels equal" in best.check and "pixels within" in best.check and "the same crop-box distribution" in best.check
    assert "fastpipe.datasets.ImageFolder" in best.code and best.line().startswith("fix: decode only the crop")


class _Tiny(Dataset):
    """32 small uint8 images, made once: the pipeline costs far less than the step."""

    def __init__(self) -> None:
        self.images = torch.randint(0, 256, (32, 3, 16, 16), dtype=torch.uint8)
        self.transform = v1.Compose([v1.ConvertImageDtype(torch.float), v1.Normalize(MEAN, STD)])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.transform(self.images[index]), index % 2


def test_where_nothing_helps_the_report_says_so_and_recommends_nothing() -> None:
    workload = Workload(loader=DataLoader(_Tiny(), batch_size=4, num_workers=0), step=lambda b: None, name="tiny")
    report = fix(workload, device="sim:200", options=MeasureOptions(steps=4, warmup=1, budget=3.0))
    measured = [r for r in report.results if r.ms_per_step is not None]
    assert measured and all(r.status == NOT_HELPING for r in measured), report.to_table()
    assert not report.recommended and "nothing is recommended" in report.to_table()
    assert report.original_ms < 1.1 * report.device_step_ms  # the planted premise: the step, not the pipeline, limits


def _spec(photos: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's training module in ``folder`` (a preset over the photos, no workers), run from there as a SPEC."""
    (folder / "train_preset.py").write_text(
        textwrap.dedent(
            f"""
            import torch, torchvision
            from tests.fakes.fix import PresetTrain

            def make():
                dataset = torchvision.datasets.ImageFolder({str(photos)!r}, PresetTrain(32))
                return torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True, num_workers=0), lambda batch: None
            """
        )
    )
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    return "train_preset:make"


def test_fix_command_on_a_users_spec(photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    spec = _spec(photos, tmp_path, monkeypatch)
    out = tmp_path / "fix.json"
    assert main(["fix", spec, "--device", "sim:5", "--steps", "3", "--warmup", "1", "--budget", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fix: decode only the crop" in printed and '"schema": "fastpipe.fix/1"' in out.read_text()


def test_diagnose_says_which_fixes_it_would_try_and_with_fix_measures_them(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    spec = _spec(photos, tmp_path, monkeypatch)
    quick = ["--device", "sim:5", "--steps", "3", "--warmup", "1", "--budget", "2", "--no-memory", "--no-stage-costs", "--no-progress"]
    assert main(["diagnose", spec, *quick]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the table wraps its notes
    assert f"fastpipe diagnose {spec} --fix" in printed and "decode only the crop (the same transform)" in printed
    assert main(["diagnose", spec, *quick, "--fix", "--fix-budget", "4", "--fix-json", str(tmp_path / "fix.json")]) == 0
    printed = capsys.readouterr().out
    assert "fastpipe fix train_preset:make on sim:5" in printed and "fix: decode only the crop" in printed
    assert (tmp_path / "fix.json").exists()
