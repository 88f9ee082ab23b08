"""``fastpipe watch`` leaves the script's loader, sampler and exit as they are without it (issue 33, items 3 and 11)."""

from __future__ import annotations

import json
import runpy
import sys
import textwrap
from pathlib import Path

import pytest

from fastpipe.cli import main

EPOCHS = textwrap.dedent("""
    import json, sys
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    class Numbers(Dataset):
        def __len__(self):
            return 24
        def __getitem__(self, i):
            return torch.tensor(i)

    data, workers = Numbers(), int(sys.argv[2])
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=5)
    distributed = DataLoader(data, batch_size=4, sampler=sampler, num_workers=workers)
    seeded = DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3), num_workers=workers)
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        orders.append([int(x) for batch in distributed for x in batch])
        orders.append([int(x) for batch in seeded for x in batch])
    out = {"orders": orders, "same_sampler": distributed.sampler is sampler, "epoch": sampler.epoch,
           "generator": seeded.generator.get_state().tolist()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
""")


def _plain(script: Path, out: Path, workers: int) -> dict:
    saved = list(sys.argv)
    sys.argv = [str(script), str(out), str(workers)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    return json.loads(out.read_text())


@pytest.mark.parametrize("workers", [0, 1])
def test_set_epoch_and_a_seeded_generator_give_the_plain_run_order(tmp_path: Path, workers: int) -> None:
    """Item 3: the timed copy deep-copied the sampler, so every epoch under watch had epoch 0's order."""
    script = tmp_path / "train.py"
    script.write_text(EPOCHS)
    plain = _plain(script, tmp_path / "plain.json", workers)
    assert plain["orders"][0] != plain["orders"][2], "set_epoch changes the order (else this test shows nothing)"
    assert main(["watch", "--", "python", str(script), str(tmp_path / "watched.json"), str(workers)]) == 0
    watched = json.loads((tmp_path / "watched.json").read_text())
    assert watched["orders"] == plain["orders"], "epoch by epoch, the same order as without fastpipe"
    assert watched["same_sampler"] and watched["epoch"] == 2 and watched["generator"] == plain["generator"]


def test_the_stages_were_really_timed_in_that_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The order above comes from the timed copy, not from the script's loader left untimed."""
    script = tmp_path / "train.py"
    script.write_text(EPOCHS)
    assert main(["watch", "--json", str(tmp_path / "w.json"), "--", "python", str(script), str(tmp_path / "o.json"), "0"]) == 0
    assert "raw load" in json.loads((tmp_path / "w.json").read_text())["stages"]


@pytest.mark.parametrize(
    "exit, status, message",
    [('sys.exit("stopped: no data in /nowhere")', 1, "stopped: no data in /nowhere"), ("sys.exit(4)", 4, None), ("sys.exit()", 0, None)],
)
def test_the_scripts_exit_status_and_message_come_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], exit: str, status: int, message: str | None
) -> None:
    """Item 11: sys.exit("message") gave exit 1 and the message was never shown."""
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nprint('started', flush=True)\n{exit}\nprint('not reached')\n")
    assert main(["watch", "--", "python", str(script)]) == status
    captured = capsys.readouterr()
    assert "started" in captured.out and "not reached" not in captured.out
    if message is not None:
        assert message in captured.err.splitlines()
