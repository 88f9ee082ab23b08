"""Every entry point leaves the user's global RNGs where they were (issue 33, item 7).

``fastpipe.diagnose`` read ``dataset[0..5]`` for its variable-input probe before the user's state was snapshotted,
so a dataset that draws (any random augmentation) moved the user's torch, NumPy and Python generators. Each entry
point runs here on such a dataset, tiny (a few steps, 16 samples), and the generators are compared before and after.
"""

from __future__ import annotations

import random
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastpipe
from fastpipe.diagnosis._options import DiagnoseOptions, MeasureOptions, TrainState
from tests.fakes.drawing import Drawing, drawing_workload

FAST = MeasureOptions(steps=2, warmup=1, budget=0.5)
QUICK = DiagnoseOptions(steps=2, warmup=1, budget=0.5, progress=False, loader_memory=False, startup=False)


def _states() -> tuple[Any, ...]:
    cuda = [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else None
    return torch.get_rng_state().tolist(), repr(np.random.get_state()), random.getstate(), cuda


def _untouched(run: Callable[[], Any]) -> None:
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    before = _states()
    run()
    after = _states()
    for name, b, a in zip(("torch", "numpy", "python", "cuda"), before, after):
        assert a == b, f"the {name} generator moved"


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "rng_factories.py").write_text(
        textwrap.dedent("""
        from tests.fakes.drawing import drawing_workload
        def make():
            return drawing_workload()
        """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rng_factories", raising=False)
    return "rng_factories:make"


def test_diagnose() -> None:
    w = drawing_workload()
    _untouched(lambda: fastpipe.diagnose(w, device="sim:1", options=QUICK))


def test_diagnose_with_the_loader_and_step() -> None:
    w = drawing_workload()
    _untouched(
        lambda: fastpipe.diagnose(
            w.loader, w.step, device="sim:1", options=QUICK, train_state=TrainState(model=w.model, optimizer=w.optimizer)
        )
    )


def test_costs() -> None:
    w = drawing_workload()
    _untouched(lambda: fastpipe.diagnosis.measure_stage_costs(w, fastpipe.devices.parse_device("sim:1"), steps=2, warmup=1))


def test_tune() -> None:
    w = drawing_workload()
    _untouched(lambda: fastpipe.tune(w, device="sim:1", options=FAST, max_workers=1, prefetch_factors=(2,), extensions=0))


def test_compare(factory_module: str) -> None:
    """compare calls the user's factories itself (a model's initialisation draws): that is fastpipe's doing too."""
    _untouched(lambda: fastpipe.compare([factory_module, factory_module], device="sim:1", options=FAST, memory=False))


def test_hf_diagnose(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from fastpipe.integrations import hf

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 3)

        def forward(self, x, labels=None):
            logits = torch.nn.functional.dropout(self.layer(x), 0.5)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Dicts(Drawing):
        def __getitem__(self, index: int) -> dict:
            x, y = super().__getitem__(index)
            return {"x": x, "labels": y}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1, report_to="none", save_strategy="no",
        logging_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = transformers.Trainer(model=Model(), args=args, train_dataset=Dicts())
    _untouched(lambda: hf.diagnose(trainer, device="sim:1", options=QUICK))


def test_lightning_diagnose() -> None:
    L = pytest.importorskip("lightning.pytorch")
    from fastpipe.integrations import lightning as fl

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 3)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(torch.nn.functional.dropout(self.layer(x), 0.5), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module, loader = Module(), DataLoader(Drawing(), batch_size=4, shuffle=True)
    _untouched(lambda: fl.diagnose(module, loader, device="sim:1", options=QUICK))
