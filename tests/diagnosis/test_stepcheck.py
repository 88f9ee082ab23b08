"""--check-step: the user's step runs once on a real batch, so a step the sim never calls cannot pass silently."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.cli import main
from fastpipe.diagnosis._stepcheck import check_step
from fastpipe.errors import PipelineError
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
    workload = Workload(
        loader=DataLoader(torch.zeros(4, 2, dtype=torch.uint8), batch_size=2),
        step=seen.append,
        device_transform=lambda batch: batch.float() / 255,
    )
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

    def fake_diagnose(workload, device, options, **seams):  # the diagnosis itself is tested in test_diagnose.py
        calls.append(options)
        report = SimpleNamespace(notes=[], interrupted=False)
        report.to_table = lambda: "\n".join(report.notes)
        return report

    monkeypatch.setattr(importlib.import_module("fastpipe.diagnosis._diagnose"), "run_diagnosis", fake_diagnose)
    code = main(["diagnose", f"{__name__}:make_working", "--device", "sim:5", "--check-step", "--budget", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0 and "step check: your step ran once on a real batch on cpu" in captured.err
    assert "step check: your step ran once" in captured.out  # the report's note
    assert calls[0].pool is None and calls[0].budget == 2.0 and calls[0].precision == 0.03


# ----- the check leaves the user's loader, sampler, generators and RNGs as they were -------------------
class Drawing(Dataset):
    """A dataset whose samples draw from every global generator, as random augmentations do."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import random

        import numpy as np

        noise = torch.rand(3) + float(np.random.rand()) + random.random()
        return torch.full((3,), float(index)) + 0 * noise, index


class OwnStateSampler(torch.utils.data.Sampler):
    """A shuffling sampler with a NumPy RandomState of its own: no torch.Generator that a snapshot could restore."""

    def __init__(self, n: int) -> None:
        import numpy as np

        self.n, self.rs, self.epochs = n, np.random.RandomState(11), 0

    def __iter__(self):
        self.epochs += 1
        return iter(self.rs.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def _states(loader: DataLoader) -> dict[str, object]:
    import pickle
    import random

    import numpy as np

    sampler = loader.sampler
    return {
        "torch": torch.get_rng_state().clone(),
        "numpy": pickle.dumps(np.random.get_state()),
        "random": random.getstate(),
        "loader generator": None if loader.generator is None else loader.generator.get_state().clone(),
        "sampler generator": None if getattr(sampler, "generator", None) is None else sampler.generator.get_state().clone(),
        "sampler own state": pickle.dumps(sampler.rs.get_state()) if hasattr(sampler, "rs") else None,
        "sampler epochs": getattr(sampler, "epochs", None),
        "iterator": getattr(loader, "_iterator", None),
    }


def _same(a: dict[str, object], b: dict[str, object]) -> list[str]:
    return [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]


def _loaders(kind: str, workers: int) -> DataLoader:
    """Two identical loaders, each with its own freshly seeded state: one is checked, the other is the control."""
    options: dict = dict(batch_size=4, num_workers=workers, persistent_workers=workers > 0)
    if kind == "shuffle":
        return DataLoader(Drawing(), shuffle=True, generator=torch.Generator().manual_seed(4), **options)
    if kind == "sampler generator":
        sampler = torch.utils.data.RandomSampler(range(12), generator=torch.Generator().manual_seed(9))
        return DataLoader(Drawing(), sampler=sampler, **options)
    if kind == "global rng":  # shuffle=True without a generator: the sampler seeds itself from the global torch RNG
        return DataLoader(Drawing(), shuffle=True, **options)
    return DataLoader(Drawing(), sampler=OwnStateSampler(12), **options)


@pytest.mark.parametrize("kind", ["shuffle", "sampler generator", "global rng", "own-state sampler"])
@pytest.mark.parametrize("workers", [0, 1])
def test_the_check_leaves_the_users_loader_sampler_and_generators_as_they_were(kind: str, workers: int) -> None:
    import random

    import numpy as np

    def seed_all() -> None:
        torch.manual_seed(1)
        np.random.seed(2)
        random.seed(3)

    model = torch.nn.Linear(3, 1)  # made before seeding: its initialisation draws from the global RNG
    seed_all()
    control = _loaders(kind, workers)
    expected_next = [batch[1].tolist() for batch in control], torch.rand(3), np.random.rand(), random.random()

    seed_all()
    loader = _loaders(kind, workers)
    before = _states(loader)
    check_step(Workload(loader=loader, step=lambda batch: model(batch[0]).sum().backward(), model=model), "sim:5")
    assert not _same(before, _states(loader)), f"moved: {_same(before, _states(loader))}"
    # what the user's loop draws next is what it would have drawn had the check never run
    assert ([batch[1].tolist() for batch in loader], torch.rand(3), np.random.rand(), random.random()) == (
        expected_next[0],
        pytest.approx(expected_next[1]),
        expected_next[2],
        expected_next[3],
    )
