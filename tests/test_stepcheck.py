"""--check-step: the user's step runs once on a real batch, so a step the sim never calls cannot pass silently."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.cli import main
from fastpipe.errors import PipelineError
from fastpipe.diagnosis._stepcheck import check_step
from fastpipe.workloads._workload import Workload, load_workload

_DATA = [(torch.ones(3), 1)] * 8


def make_broken(device):
    """A model for 2 features fed batches of 3: fails on the first real batch."""
    model = torch.nn.Linear(2, 1).to(device)

    def step(batch):
        inputs, _ = batch
        model(inputs).sum().backward()

    return Workload(loader=DataLoader(_DATA, batch_size=4), step=step, model=model)


def make_working(device):
    model = torch.nn.Linear(3, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def step(batch):
        inputs, labels = batch
        optimizer.zero_grad()
        (model(inputs.float()).squeeze(1) - labels.float()).pow(2).mean().backward()
        optimizer.step()

    return Workload(loader=DataLoader(_DATA, batch_size=4), step=step, model=model, optimizer=optimizer)


class Failing(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        raise OSError("cannot read sample.jpg")


@pytest.mark.parametrize("device", ["sim:5", "cpu"])
def test_a_broken_step_fails_with_its_own_error(device: str) -> None:
    workload = load_workload(f"{__name__}:make_broken", device)
    with pytest.raises(PipelineError) as info:
        check_step(workload, device)
    message = str(info.value)
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in message
    assert "test_stepcheck.py" in message and "in step" in message  # the user's own line
    assert "(4, 3) torch.float32" in message and info.value.stage == "step"
    assert ("never run" in message) == device.startswith("sim")


def test_a_working_step_runs_once_and_trains_nothing() -> None:
    workload = load_workload(f"{__name__}:make_working", "sim:5")
    before = [p.detach().clone() for p in workload.model.parameters()]
    calls = []
    step = workload.step
    workload.step = lambda batch: calls.append(batch) or step(batch)
    result = check_step(workload, "sim:5")
    assert len(calls) == 1 and result.device == "cpu" and "ran once" in result.line()
    assert all(torch.equal(a, b) for a, b in zip(before, workload.model.parameters()))
    assert all(p.grad is None for p in workload.model.parameters())


def test_the_device_transform_runs_before_the_step() -> None:
    seen = []
    workload = Workload(loader=DataLoader(torch.zeros(4, 2, dtype=torch.uint8), batch_size=2), step=seen.append,
                        device_transform=lambda batch: batch.float() / 255)
    check_step(workload, "sim:5")
    assert seen[0].dtype == torch.float32


def test_a_loader_that_fails_is_named() -> None:
    workload = Workload(loader=DataLoader(Failing(), batch_size=2), step=lambda batch: None)
    with pytest.raises(PipelineError, match="loader failed on its first batch: OSError: cannot read sample.jpg"):
        check_step(workload, "sim:5")


def test_cli_check_step_stops_a_broken_step_on_sim(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", f"{__name__}:make_broken", "--device", "sim:5", "--check-step", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("fastpipe: error: step check: your step raised RuntimeError") and "\n" not in err


def test_cli_check_step_passes_then_diagnoses_and_the_report_notes_it(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib
    from types import SimpleNamespace

    calls = []

    def fake_diagnose(workload, **options):  # the diagnosis itself is tested in test_diagnose.py
        calls.append(options)
        report = SimpleNamespace(notes=[], interrupted=False)
        report.to_table = lambda: "\n".join(report.notes)
        return report

    monkeypatch.setattr(importlib.import_module("fastpipe.diagnosis._diagnose"), "diagnose", fake_diagnose)
    code = main(["diagnose", f"{__name__}:make_working", "--device", "sim:5", "--check-step", "--budget", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0 and "step check: your step ran once on a real batch on cpu" in captured.err
    assert "step check: your step ran once" in captured.out  # the report's note
    assert calls[0]["pool"] is None and calls[0]["budget"] == 2.0 and calls[0]["precision"] == 0.03
