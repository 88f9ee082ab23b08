"""`fastpipe diagnose module:factory` where the factory returns a LightningModule and a datamodule."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("lightning.pytorch")

from fastpipe.cli import main  # noqa: E402
from fastpipe.commands.common import trainer_objects  # noqa: E402
from fastpipe.workloads._workload import load_workload  # noqa: E402

FACTORY = textwrap.dedent(
    """
    import time

    import lightning.pytorch as L
    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader

    from tests.fakes import Fast, PlantedDataset, Slow


    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 10)
            self.steps_run = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.steps_run += 1
            loss = torch.nn.functional.cross_entropy(self.layer(x), y)
            self.log("train_loss", loss)  # no trainer attached: fastpipe drops it
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    class Data(L.LightningDataModule):
        def __init__(self, transform, workers):
            super().__init__()
            self.transform, self.workers = transform, workers

        def train_dataloader(self):
            dataset = PlantedDataset(length=400, shape=(4,), transform=self.transform)
            return DataLoader(dataset, batch_size=4, num_workers=self.workers)


    def make():
        return Tiny(), Data(T.Compose([Fast()]), workers=0)


    def make_planted():
        return Tiny(), Data(T.Compose([Slow(40), Fast()]), workers=2)
    """
)


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "lit_factory.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lit_factory"
    sys.modules.pop("lit_factory", None)


def test_a_module_and_datamodule_factory_is_a_workload_of_the_modules_own_step(factory) -> None:
    workload = load_workload(f"{factory}:make", "sim:20", adapt=trainer_objects)
    module = workload.model
    assert type(module).__name__ == "Tiny" and workload.optimizer is not None
    batch = next(iter(workload.loader))
    workload.step(batch)
    assert module.steps_run == 1  # the module's training_step ran, its self.log dropped
    assert "Lightning" in workload.name


def test_without_the_adapter_a_module_pair_says_where_it_is_taken(factory) -> None:
    from fastpipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"lightning.diagnose\(module, datamodule"):
        load_workload(f"{factory}:make", "sim:20")


def test_the_cli_diagnoses_a_lightning_factory(factory, capsys) -> None:
    code = main(
        ["diagnose", f"{factory}:make", "--device", "cpu", "--steps", "2", "--warmup", "0", "--budget", "0.3"]
        + ["--no-progress", "--no-stage-costs"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "Lightning" in out and "baseline" in out


@pytest.mark.slow  # a whole ladder
def test_the_cli_names_the_planted_stage_of_a_lightning_datamodule(factory, capsys) -> None:
    args = ["diagnose", f"{factory}:make_planted", "--device", "sim:30", "--steps", "6", "--warmup", "2", "--budget", "1"]
    assert main([*args, "--threshold", "0.25", "--no-progress", "--no-stage-costs"]) == 0
    out = capsys.readouterr().out
    named = out.split("Stages that cost time per step", 1)[-1]
    assert "  - Slow [transform]" in named and "  - Fast [" not in named, out
