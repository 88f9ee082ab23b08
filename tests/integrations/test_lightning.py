"""fastpipe in Lightning: the callback's share against planted costs, and the ladder on a module's own step."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

from tests.fakes import Fast, PlantedDataset, Slow, quick_options
from tests.fakes.watch_settings import FRAMEWORK_SETTINGS, IDS, TOLERANCE, Setting

L = pytest.importorskip("lightning.pytorch")
from fastpipe.integrations import lightning as fl  # noqa: E402

STEPS = 8


class Tiny(L.LightningModule):
    """A linear classifier whose training step also sleeps ``step_ms`` (the planted step)."""

    def __init__(self, step_ms: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 10)
        self.step_ms = step_ms
        self.steps_run = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.step_ms:
            time.sleep(self.step_ms / 1000)
        self.steps_run += 1
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Data(L.LightningDataModule):
    def __init__(self, dataset, **loader_options) -> None:
        super().__init__()
        self.dataset, self.loader_options = dataset, loader_options

    def train_dataloader(self):
        return DataLoader(self.dataset, **self.loader_options)


def trainer(callback, **kwargs):
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


@pytest.mark.parametrize("setting", FRAMEWORK_SETTINGS, ids=IDS)
def test_callback_share_is_the_planted_one(setting: Setting) -> None:
    callback = fl.WatchCallback(echo=False, memory=False)
    data = Data(PlantedDataset(length=STEPS, shape=(4,), raw_ms=setting.loader_ms), batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "does not have many workers": num_workers=0 is the planted setting
        fit = trainer(callback, max_epochs=1)
        fit.fit(Tiny(setting.step_ms), data)
    logged = float(fit.callback_metrics[fl.SHARE_METRIC])
    print(
        f"Lightning {setting.name} (loader {setting.loader_ms:g} ms, step {setting.step_ms:g} ms): "
        f"planted {setting.truth:.1%}, logged {logged:.1%}"
    )
    summary = callback.watch.summary()
    assert summary["steps"] == STEPS
    assert (summary["next_step"] is not None) == (setting.truth >= 0.05)
    if summary["next_step"]:
        assert "fastpipe.integrations.lightning.diagnose(module, datamodule" in summary["next_step"]
    assert logged == pytest.approx(setting.truth, abs=TOLERANCE)


def test_callback_leaves_validation_loaders_alone_and_restores_dataloader_iter() -> None:
    original = DataLoader.__iter__
    callback = fl.WatchCallback(echo=False, memory=False)

    class WithVal(Data):
        def val_dataloader(self):
            return DataLoader(PlantedDataset(length=3, shape=(4,), raw_ms=50), batch_size=1)

    class TinyVal(Tiny):
        def validation_step(self, batch, batch_idx):
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = trainer(callback, max_epochs=2, num_sanity_val_steps=0)
        fit.fit(TinyVal(5), WithVal(PlantedDataset(length=6, shape=(4,)), batch_size=1))
    summary = callback.watch.summary()
    assert summary["steps"] == 12 and summary["epochs"] == 2
    assert summary["input_bound_share"] < 0.2  # 3 x 50 ms of validation loading per epoch neither counted nor waited on
    assert DataLoader.__iter__ is original


@pytest.mark.slow  # 10-20 s on 2 shared cores: a whole ladder
def test_diagnose_names_the_planted_stage_and_restores_the_module() -> None:
    module = Tiny(step_ms=30)  # a 30 ms step against 4 x 40 ms of Slow over 2 workers: 80 ms a batch
    before = {k: v.clone() for k, v in module.state_dict().items()}
    data = Data(PlantedDataset(length=400, shape=(4,), transform=T.Compose([Slow(40), Fast()])), batch_size=4, num_workers=2)
    report = fl.diagnose(
        module, data, device="cpu", options=quick_options(steps=6, warmup=2, threshold=0.25, budget=1.0, stage_costs=False)
    )
    print(report.to_table())
    named = [b.stage for b in report.bottlenecks]
    assert named[0] == "Slow" and "Fast" not in named, named
    assert module.steps_run > 0  # the module's own training_step ran
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert "log" not in vars(module)


def test_diagnose_refuses_what_it_cannot_reproduce() -> None:
    from fastpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="LightningModule"):
        fl.diagnose(torch.nn.Linear(2, 2), DataLoader(PlantedDataset(length=4)), device="cpu")
    with pytest.raises(ConfigError, match="precision"):
        fl.diagnose(Tiny(), DataLoader(PlantedDataset(length=8, shape=(4,))), device="cpu", precision="transformer-engine")
