import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastpipe.cli import main


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["run", "toy:naive", "--device", "sim:abc"], "sim:290"),
        (["run", "toy:bogus", "--device", "sim:10"], "toy:naive"),
        (["run", "nomodule_xyz:make", "--device", "sim:10"], "current directory"),
        (["run", "justaword", "--device", "sim:10"], "package.module:function"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastpipe: error:") and "\n" not in err and fix in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu_exit_2_no_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "fastpipe", "run", "toy:naive", "--device", "cuda"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "--device cpu" in proc.stderr


def test_run_small_toy_on_sim(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "toy:naive", "--device", "sim:5", "--steps", "3", "--warmup", "1"]
    argv += ["--num-workers", "0", "--batch-size", "2", "--raw-size", "64", "--img-size", "32"]
    assert main(argv) == 0
    assert "steps/s" in capsys.readouterr().out


USER_TRAIN_PY = """
import torch
from torch.utils.data import DataLoader


def make_workload(device):
    model = torch.nn.Linear(2, 2).to(device)  # device is a torch.device, as model.to expects
    return DataLoader(torch.zeros(8, 2), batch_size=2), lambda batch: model(batch).sum().backward()
"""


def test_cli_finds_the_users_module_in_the_current_directory(tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train_cli_probe.py").write_text(USER_TRAIN_PY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])  # as a console script has it
    try:
        assert main(["run", "train_cli_probe:make_workload", "--device", "cpu", "--steps", "2", "--warmup", "0"]) == 0
    finally:
        sys.modules.pop("train_cli_probe", None)
    assert "steps/s" in capsys.readouterr().out


def test_console_script_from_the_users_folder(tmp_path) -> None:
    script = Path(sys.executable).parent / "fastpipe"
    if not script.exists():
        pytest.skip("the fastpipe console script is not installed in this environment")
    (tmp_path / "train.py").write_text(USER_TRAIN_PY)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(script), "run", "train:make_workload", "--device", "sim:5", "--steps", "2", "--warmup", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "train:make_workload on sim:5" in proc.stdout


def test_builtin_size_options_reach_jpeg_but_not_user_specs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "mypkg.train:make", "--device", "sim:5", "--batch-size", "4"]) == 2
    assert "only apply to the built-in toy:* and jpeg:* workloads" in capsys.readouterr().err
    assert main(["run", "jpeg:naive", "--device", "sim:5", "--raw-size", "64"]) == 2  # the jpeg family's own check
    assert "jpeg workloads have no raw_size" in capsys.readouterr().err
