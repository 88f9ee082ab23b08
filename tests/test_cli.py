import subprocess
import sys

import pytest
import torch

from fastpipe.cli import main


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["run", "toy:naive", "--device", "sim:abc"], "sim:290"),
        (["run", "toy:bogus", "--device", "sim:10"], "toy:naive"),
        (["run", "nomodule_xyz:make", "--device", "sim:10"], "PYTHONPATH"),
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
