"""fastpipe in the Hugging Face Trainer: the callback's share against planted costs, and the ladder on a Trainer."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import Dataset

from tests.fakes import Fast, Slow, quick_options
from tests.fakes.watch_settings import FRAMEWORK_SETTINGS, IDS, TOLERANCE, Setting

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from fastpipe.integrations import hf  # noqa: E402

STEPS = 8


class Samples(Dataset):
    """Dict samples as a tokenized dataset gives them; the raw load sleeps ``raw_ms``, then ``transform``."""

    def __init__(self, length: int, raw_ms: float = 0.0, transform=None) -> None:
        self.length, self.raw_ms, self.transform = length, raw_ms, transform

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        if self.raw_ms:
            time.sleep(self.raw_ms / 1000)
        x = torch.full((4,), float(index % 7))
        if self.transform is not None:
            x = self.transform(x)
        return {"x": x, "labels": index % 3}


class TinyModel(torch.nn.Module):
    """A model the Trainer accepts (forward returns the loss first); built here, nothing downloaded."""

    def __init__(self, step_ms: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 3)
        self.step_ms = step_ms
        self.calls = 0

    def forward(self, x, labels=None):
        if self.step_ms:
            time.sleep(self.step_ms / 1000)
        self.calls += 1
        logits = self.layer(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def make_trainer(tmp_path, model, dataset, **args):
    options = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,
        num_train_epochs=1,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        learning_rate=0.1,
    )
    options.update(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.Trainer(model=model, args=transformers.TrainingArguments(**options), train_dataset=dataset)


@pytest.mark.parametrize("setting", FRAMEWORK_SETTINGS, ids=IDS)
def test_callback_share_is_the_planted_one(tmp_path, setting: Setting) -> None:
    trainer = make_trainer(tmp_path, TinyModel(setting.step_ms), Samples(STEPS, raw_ms=setting.loader_ms))
    callback = hf.watch(trainer, echo=False, memory=False)
    trainer.train()
    (logged,) = [entry[hf.SHARE_METRIC] for entry in trainer.state.log_history if hf.SHARE_METRIC in entry]
    print(
        f"HF Trainer {setting.name} (loader {setting.loader_ms:g} ms, step {setting.step_ms:g} ms): "
        f"planted {setting.truth:.1%}, logged {logged:.1%}"
    )
    summary = callback.watch.summary()
    assert summary["steps"] == STEPS
    if summary["next_step"]:
        assert 'fastpipe.integrations.hf.diagnose(trainer, device="cpu")' in summary["next_step"]
    assert logged == pytest.approx(setting.truth, abs=TOLERANCE)
    assert torch.utils.data.DataLoader.__iter__.__name__ == "__iter__" and callback._tap is None


@pytest.mark.slow  # 10-20 s on 2 shared cores: a whole ladder
def test_diagnose_names_the_planted_stage_and_restores_the_trainer(tmp_path) -> None:
    model = TinyModel(step_ms=30)  # a 30 ms step against 4 x 40 ms of Slow over 2 workers: 80 ms a batch
    dataset = Samples(400, transform=T.Compose([Slow(40), Fast()]))
    trainer = make_trainer(tmp_path, model, dataset, per_device_train_batch_size=4, dataloader_num_workers=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = hf.diagnose(trainer, device="cpu", options=quick_options(steps=6, warmup=2, threshold=0.25, budget=1.0, stage_costs=False))
    print(report.to_table())
    named = [b.stage for b in report.bottlenecks]
    assert named and named[0] == "Slow" and "Fast" not in named, named
    assert model.calls > 0  # the trainer's own training_step ran the model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert trainer.optimizer is None and trainer.lr_scheduler is None


def test_diagnose_refuses_what_it_is_not(tmp_path) -> None:
    from fastpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="transformers.Trainer"):
        hf.diagnose(object(), device="cpu")
