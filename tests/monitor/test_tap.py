"""The DataLoader tap is undone on every way out (issue 33, item 8): a Trainer that raises, Ctrl-C, taps closed out of order."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.monitor import Watch, tap_dataloaders

ORIGINAL = DataLoader.__iter__


def _loader() -> DataLoader:
    return DataLoader(torch.arange(6.0).reshape(6, 1), batch_size=2)


def test_taps_closed_out_of_order_leave_no_stale_patch() -> None:
    """Two taps opened A then B and closed A then B: the old code's B put A's patch back on closing."""
    seen: list[str] = []
    watch_a, watch_b = Watch([], echo=False, memory=False), Watch([], echo=False, memory=False)
    a = tap_dataloaders(lambda loader: seen.append("a") or watch_a)
    b = tap_dataloaders(lambda loader: seen.append("b") or watch_b)
    a.__enter__()
    b.__enter__()
    assert [len(list(_loader())), seen] == [3, ["b", "a"]], "nested: the latest first, over the earlier one"
    a.__exit__(None, None, None)
    seen.clear()
    list(_loader())
    assert seen == ["b"], "a closed tap is never run again"
    b.__exit__(None, None, None)
    assert DataLoader.__iter__ is ORIGINAL
    seen.clear()
    list(_loader())
    assert seen == [] and watch_b.ledger.total.steps == 6


def test_taps_closed_in_order_restore_too() -> None:
    with tap_dataloaders(lambda loader: None):
        with tap_dataloaders(lambda loader: None):
            assert DataLoader.__iter__ is not ORIGINAL
        assert DataLoader.__iter__ is not ORIGINAL
    assert DataLoader.__iter__ is ORIGINAL


# ----- the Hugging Face Trainer ---------------------------------------------------------------------


class Samples(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        return {"x": torch.full((4,), float(index % 7)), "labels": index % 3}


class Failing(torch.nn.Module):
    """Raises ``error`` on its third forward, inside ``trainer.train()``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.layer, self.error, self.calls = torch.nn.Linear(4, 3), error, 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls == 3:
            raise self.error
        logits = self.layer(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _trainer(tmp_path, model, callbacks=None):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=1, num_train_epochs=1, report_to="none", save_strategy="no",
        logging_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.Trainer(model=model, args=args, train_dataset=Samples(), callbacks=callbacks)


@pytest.mark.parametrize("error", [RuntimeError("the step failed"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_hf_watch_undoes_the_patch_when_training_raises(tmp_path, error: BaseException) -> None:
    from fastpipe.integrations import hf

    trainer = _trainer(tmp_path, Failing(error))
    callback = hf.watch(trainer, echo=False, memory=False)
    with pytest.raises(type(error)):
        trainer.train()
    assert DataLoader.__iter__ is ORIGINAL
    assert callback.watch is not None and callback.watch.ledger.current(0).steps >= 2, "it watched until the error"


def test_a_callback_given_to_the_trainer_undoes_the_patch_too(tmp_path) -> None:
    from fastpipe.integrations import hf

    trainer = _trainer(tmp_path, Failing(RuntimeError("boom")), callbacks=[hf.WatchCallback(echo=False, memory=False)])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert DataLoader.__iter__ is ORIGINAL


def test_a_callback_added_late_undoes_the_patch_at_the_next_iter(tmp_path) -> None:
    """Added after the Trainer was made, without the trainer: nothing wraps train(), so the tap closes itself at the
    first iter() after training left, and that iter is the loader's own."""
    from fastpipe.integrations import hf

    trainer = _trainer(tmp_path, Failing(RuntimeError("boom")))
    trainer.add_callback(hf.WatchCallback(echo=False, memory=False))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert [b.tolist() for b in _loader()] == [[[0.0], [1.0]], [[2.0], [3.0]], [[4.0], [5.0]]]
    assert DataLoader.__iter__ is ORIGINAL


def test_a_completed_training_restores_and_can_train_again(tmp_path) -> None:
    from fastpipe.integrations import hf

    model = Failing(RuntimeError("never"))
    model.calls = -100  # never reaches 3
    trainer = _trainer(tmp_path, model)
    callback = hf.watch(trainer, echo=False, memory=False)
    trainer.train()
    assert DataLoader.__iter__ is ORIGINAL and callback.watch.ledger.total.steps == 8
    trainer.train()
    assert DataLoader.__iter__ is ORIGINAL and callback.watch.ledger.total.steps == 8, "a new watch for the second run"
