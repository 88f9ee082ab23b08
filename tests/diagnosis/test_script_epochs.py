"""Script mode keeps the script's epochs (issue 38, item 1).

The ladder used to hand the script batches past ``len(loader)``: timm's ``train.py`` worked out its accumulation steps
from the batches left and divided by zero, OneCycleLR raised past its total steps. Each test runs
``tests/scripts/train_epochs_counted.py``, a loop that asserts every batch index is below ``len(loader)`` and that
each epoch held exactly ``len(loader)`` batches (it raises ``AssertionError``, exit 1, otherwise), with a validation
pass after each epoch. Its epochs are short (13 batches), so the ladder spans several of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fastpipe.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_epochs_counted.py"
pytestmark = pytest.mark.usefixtures("clean", "one_thread")
QUICK = ["--no-memory", "--no-stage-costs", "--steps", "4", "--warmup", "1", "--precision", "0.2"]


def diagnose(capsys, *flags: str, script_args: list[str]) -> tuple[int, str, str]:
    code = main(["diagnose", *flags, "--", "python", str(SCRIPT), *script_args])
    out, err = capsys.readouterr()
    return code, out, err


def _epochs(out: str) -> list[tuple[int, int, int | None]]:
    """``(epoch, batches, len(loader))`` of each epoch the script finished (its own lines)."""
    return [
        (int(e), int(n), None if n_ == "None" else int(n_)) for e, n, n_ in re.findall(r"^epoch (\d+): (\d+) batches of (\w+)$", out, re.M)
    ]


def _ladder_steps(out: str) -> int:
    return int(re.search(r"took (\d+) steps of its loop", out).group(1))


def test_each_epoch_ends_at_its_length_with_onecycle_and_timms_accumulation(capsys) -> None:
    # 100 images, batch 8: 13 batches an epoch; OneCycleLR over 20 epochs of 13 steps (it raises past them);
    # timm's accumulation of 3 (its last 13 % 3 = 1 batch accumulates alone; past the epoch, a modulo by zero).
    # Each sample waits 2 ms (16 ms a batch for one of 2 workers, against a step of about 1 ms): the loop is input-bound
    # on any machine, so the ladder measures every point and spans several epochs. Without the wait a fast machine's
    # baseline ran at the device bound, only two points were measured, and the ladder ended inside epoch 1.
    args = ["--samples", "100", "--epochs", "20", "--onecycle", "--accum", "3", "--sample-ms", "2"]
    code, out, err = diagnose(capsys, *QUICK, "--budget-steps", "80", script_args=args)
    assert code == 0, out + err
    assert "fastpipe diagnosis:" in out and "Traceback" not in err
    epochs = _epochs(out)
    # the ladder took over at batch 6 of epoch 0 and ran across epoch ends: each epoch still held 13 batches
    assert len(epochs) >= 2 and all(n == length == 13 for _, n, length in epochs), epochs
    assert _ladder_steps(out) > 13 - 5
    assert "the script's epochs were kept" in out
    assert f"{len(epochs)} of DataLoader #1's epochs ended during the ladder" in out


def test_then_continue_after_epochs_finishes_every_epoch_at_its_length(tmp_path, capsys) -> None:
    trace = tmp_path / "trace.pt"
    args = ["--samples", "100", "--epochs", "8", "--drop-last", "--trace", str(trace)]
    code, out, err = diagnose(capsys, *QUICK, "--budget-steps", "40", "--then-continue", script_args=args)
    assert code == 0, out + err
    assert "fastpipe diagnosis:" in out
    # drop_last: 12 batches an epoch, all 8 epochs finished at their length, and the script ended by itself
    assert [(e, n) for e, n, _ in _epochs(out)] == [(e, 12) for e in range(8)]
    assert "trained 96 steps" in out
    steps = _ladder_steps(out)
    states = torch.load(trace)
    assert [s for s, _, _ in states] == list(range(96))
    before = states[5][1]  # the model before the ladder's first step (after 5 real ones)

    def same(a: dict, b: dict) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    # the ladder trained the model on replayed batches, and the first real step after it started from the state the
    # script had when the ladder took over
    assert any(not same(before, model) for _, model, _ in states[6 : 5 + steps])
    assert same(before, states[5 + steps][1])


@pytest.mark.parametrize("flags", [["--drop-last"], ["--iterable"]], ids=["drop_last", "stream_without_len"])
def test_dry_run_keeps_epochs_of_other_loaders(flags, capsys) -> None:
    args = ["--samples", "100", "--epochs", "20", *flags]
    code, out, err = diagnose(capsys, *QUICK, "--budget-steps", "60", script_args=args)
    assert code == 0, out + err
    assert "fastpipe diagnosis:" in out
    epochs = _epochs(out)
    if "--iterable" in flags:
        # no len(): no epoch length to keep, the ladder's batches go on in the epoch it took over (none ends)
        assert epochs == [] and "epochs were kept" not in out
    else:
        assert len(epochs) >= 1 and all(n == length == 12 for _, n, length in epochs), epochs
        assert f"{len(epochs)} of DataLoader #1's epochs ended during the ladder" in out


TIMM = SCRIPT.parent / "train_epochs_timm.py"


def test_timms_loop_keeps_its_epochs_and_checkpoints_its_own_state(tmp_path, capsys) -> None:
    # timm's create_loader (its PrefetchLoader asks for the next batch before it hands over the current one), its
    # accumulation arithmetic (3 batches an update; past the epoch, accum_steps = 12 % 3 = 0 and a modulo by zero),
    # and a checkpoint at each epoch's end with no validation pass before it
    trace = tmp_path / "trace.pt"
    args = ["--epochs", "20", "--samples", "200", "--grad-accum-steps", "3", "--output", str(tmp_path), "--trace", str(trace)]
    code = main(["diagnose", *QUICK, "--steps", "10", "--budget-steps", "80", "--", "python", str(TIMM), *args])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "fastpipe diagnosis:" in out and "Traceback" not in err
    epochs = _epochs(out)
    assert len(epochs) >= 2 and all(n == length == 12 for _, n, length in epochs), epochs
    states = torch.load(trace)
    # the ladder took over at the DataLoader's 6th batch, when the script had trained on 4 (the prefetcher holds the
    # 5th): the state it had then is the one each checkpoint written during the ladder must hold
    before = states[4][1]
    checkpoints = sorted(tmp_path.glob("checkpoint-*.pt"))
    assert len(checkpoints) == len(epochs)
    for path in checkpoints:
        saved = torch.load(path)["model"]
        assert all(torch.equal(before[k], saved[k]) for k in before), path.name
    # and the ladder did train the model between them (a check that could fail)
    assert any(not all(torch.equal(before[k], model[k]) for k in before) for _, model in states[6:])
