"""``fastpipe watch -- python SCRIPT``: unmodified scripts, run in-process, with the share, stages and next step."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from fastpipe.cli import main
from fastpipe.commands.watch import parse_command
from fastpipe.errors import ConfigError
from tests.fakes.watch_settings import SETTINGS, TOLERANCE

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "watch" / "train_imagenet_like.py"

PLANTED = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    LOADER_MS, STEP_MS, STEPS = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

    class Slow(Dataset):
        def __len__(self):
            return STEPS
        def __getitem__(self, i):
            time.sleep(LOADER_MS / 1000)
            return torch.zeros(4)

    val = DataLoader(Slow(), batch_size=4)          # iterated less: not the training loader
    for batch in DataLoader(Slow(), batch_size=1):
        time.sleep(STEP_MS / 1000)
    print("trained", flush=True)
    if len(sys.argv) > 4:
        raise {exit}
""")


def write_script(tmp_path: Path, exit: str = "SystemExit(3)") -> Path:
    path = tmp_path / "train.py"
    path.write_text(PLANTED.replace("{exit}", exit))
    return path


@pytest.mark.parametrize("setting", [SETTINGS[0], SETTINGS[2]], ids=[SETTINGS[0].name, SETTINGS[2].name])
def test_planted_script_share(tmp_path, capsys, setting) -> None:
    script = write_script(tmp_path)
    out = tmp_path / "watch.json"
    code = main(["watch", "--json", str(out), "--", "python", str(script), str(setting.loader_ms), str(setting.step_ms), "20"])
    captured = capsys.readouterr()
    summary = json.loads(out.read_text())
    print(f"fastpipe watch {setting.name}: planted {setting.truth:.1%}, reported {summary['input_bound_share']:.1%}")
    assert code == 0 and "trained" in captured.out
    assert summary["steps"] == 20 and summary["loader"] == "DataLoader #1"
    assert summary["input_bound_share"] == pytest.approx(setting.truth, abs=TOLERANCE)
    assert "raw load" in summary["stages"] and "collate" in summary["stages"]
    assert ("write a factory" in captured.err) == (setting.truth >= 0.05)
    ran = f"fastpipe diagnose -- python {script} {setting.loader_ms} {setting.step_ms} 20"
    assert (ran in captured.err) == (setting.truth >= 0.05)
    assert DataLoader.__iter__.__qualname__ == "DataLoader.__iter__"


def test_exit_code_and_ctrl_c_still_report(tmp_path, capsys) -> None:
    script = write_script(tmp_path)
    assert main(["watch", "--", "python", str(script), "5", "1", "4", "exit"]) == 3
    assert "waited for batches" in capsys.readouterr().err
    script = write_script(tmp_path, exit="KeyboardInterrupt")
    assert main(["watch", "--no-stages", "--", "python", str(script), "5", "1", "4", "interrupt"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C)" in err and "waited for batches" in err and "stages inside the workers" not in err


def test_imagenet_like_example_unmodified(capsys) -> None:
    code = main(["watch", "--", "python", str(EXAMPLE), "--epochs", "1", "--samples", "64", "-b", "8", "-j", "2"])
    captured = capsys.readouterr()
    print(captured.err)
    assert code == 0 and "Epoch: [0][0/8]" in captured.out
    assert "waited for batches" in captured.err and "8 steps in 1 epoch(s)" in captured.err
    for stage in ("RandomResizedCrop", "ToTensor", "Normalize", "raw load", "collate"):
        assert stage in captured.err


def test_imagenet_like_example_on_a_photo_folder(tmp_path, capsys) -> None:
    """Getting started's path: the example's --data reads DIR/train as an ImageFolder of JPEGs (FakeData without it)."""
    pytest.importorskip("skimage", reason="the photo corpus needs fastpipe[photos]")
    from fastpipe.workloads.photos import build_corpus

    build_corpus(tmp_path / "photos" / "train", n=40, seed=0, classes=4)
    code = main(["watch", "--", "python", str(EXAMPLE), "--data", str(tmp_path / "photos"), "--epochs", "1", "-b", "8", "-j", "1"])
    captured = capsys.readouterr()
    assert code == 0 and "Epoch: [0][0/5]" in captured.out  # 40 photos in batches of 8
    assert "waited for batches" in captured.err and "5 steps in 1 epoch(s)" in captured.err


def test_command_parsing() -> None:
    assert parse_command(["--", "python", str(EXAMPLE), "-b", "8"]) == ("path", str(EXAMPLE), ["-b", "8"])
    assert parse_command(["python3", "-m", "pkg.train", "--lr", "1"]) == ("module", "pkg.train", ["--lr", "1"])
    with pytest.raises(ConfigError, match="needs a script"):
        parse_command(["--"])
    with pytest.raises(ConfigError, match="no script 'missing.py'"):
        parse_command(["python", "missing.py"])
    assert main(["watch", "--", "python", "missing.py"]) == 2


STREAM = textwrap.dedent("""
    import sys
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Stream(IterableDataset):
        def __init__(self, sharded):
            self.sharded = sharded
        def __iter__(self):
            info = get_worker_info()
            worker, workers = (0, 1) if info is None or not self.sharded else (info.id, info.num_workers)
            for i in range(worker, 200, workers):
                yield torch.full((4,), float(i))

    if __name__ == "__main__":
        steps = sum(1 for _ in DataLoader(Stream(sys.argv[1] == "sharded"), batch_size=4, num_workers=2))
        print(f"trained {steps} steps", flush=True)
""")


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_check_streams_reports_duplicates_of_an_unsharded_stream_and_none_of_a_sharded_one(tmp_path, capsys, sharded) -> None:
    script = tmp_path / "stream.py"
    script.write_text(STREAM)
    out = tmp_path / "watch.json"
    args = ["watch", "--no-stages", "--check-streams", "--json", str(out), "--", "python", str(script)]
    code = main(args + ["sharded" if sharded else "plain"])
    captured = capsys.readouterr()
    streams = json.loads(out.read_text())["streams"]
    assert code == 0 and f"trained {50 if sharded else 100} steps" in captured.out
    assert streams["sources"] == ["worker 0", "worker 1"] and streams["drawn"] == 64
    assert streams["duplicates"] is not sharded and not streams["uneven"]
    if sharded:
        assert "DataLoader #1: Streams: no duplicates across 2 sources and even shares" in captured.err
    else:
        assert "duplicates: 64 of 64 items drawn were also drawn by another worker" in captured.err
        assert "get_worker_info()" in captured.err and "fix:" in captured.err


SLOW_INIT = textwrap.dedent("""
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            return torch.full((4,), float(i * i))

    def slow_init(worker_id):
        time.sleep(0.3)

    if __name__ == "__main__":
        loader = DataLoader(Squares(), batch_size=4, num_workers=2, worker_init_fn=slow_init, multiprocessing_context="fork")
        steps = sum(1 for epoch in range(2) for _ in loader)
        print(f"trained {steps} steps", flush=True)
""")


def test_startup_splits_the_training_loaders_first_batch_after_the_script(tmp_path, capsys) -> None:
    # issue 34 item 1: watch has the first batch and the restarts; --startup adds the split and the fixes' savings
    script = tmp_path / "slow_init.py"
    script.write_text(SLOW_INIT)
    out = tmp_path / "watch.json"
    code = main(["watch", "--no-stages", "--startup", "--json", str(out), "--", "python", str(script)])
    captured = capsys.readouterr()
    assert code == 0 and "trained 8 steps" in captured.out
    assert "Start-up (2 workers, fork, persistent_workers=False)" in captured.err, captured.err
    assert "worker_init_fn" in captured.err and "persistent_workers=True: saves" in captured.err
    startup = json.loads(out.read_text())["startup"]
    parts = dict(startup["parts"])
    assert parts["worker_init_fn"] == pytest.approx(0.3, abs=0.25)  # worker 0's own 0.3 s sleep, on its timeline
    assert startup["restart_s"] > startup["kept_s"] + 0.2  # a fresh start pays the init again; kept workers do not
    # the script's own run is reported first and untouched by the pass, which starts the loader's workers afterwards
    assert captured.err.index("fastpipe watch:") < captured.err.index("Start-up (")


def test_startup_is_not_measured_without_the_flag(tmp_path, capsys) -> None:
    script = tmp_path / "slow_init.py"
    script.write_text(SLOW_INIT)
    assert main(["watch", "--no-stages", "--", "python", str(script)]) == 0
    assert "Start-up (" not in capsys.readouterr().err
