"""``fastpipe compare -- python a.py ARGS -- python b.py ARGS``: two scripts, each timed in its own loop, in rotated
rounds (``experiments/_compare_scripts``)."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Sequence

import pytest

from fastpipe.cli import build_parser
from fastpipe.errors import ConfigError
from fastpipe.experiments import _compare_scripts as cs

SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_commands_split_on_the_second_dashes() -> None:
    parser = build_parser()
    args = parser.parse_args(["compare", "--rounds", "2", "--", "python", "a.py", "--x", "1", "--", "python", "b.py", "-j", "2"])
    assert cs.is_scripts(args.specs) and args.rounds == 2
    assert cs.split_commands(args.specs) == (["python", "a.py", "--x", "1"], ["python", "b.py", "-j", "2"])
    assert not cs.is_scripts(["toy"]) and not cs.is_scripts(["pkg.before:make", "pkg.after:make"])
    with pytest.raises(ConfigError, match="one `--` between"):
        cs.split_commands(["python", "a.py"])


def test_options_that_cannot_apply_to_scripts_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("")
    words = ["--", "python", str(tmp_path / "a.py"), "--", "python", str(tmp_path / "a.py")]
    for flags, message in ((["--device", "cuda"], "--device applies to SPECs"), (["--plot", str(tmp_path / "x.png")], "--plot")):
        args = build_parser().parse_args(["compare", *flags, *words])
        with pytest.raises(ConfigError, match=message):
            cs.run_cli(args)


def test_expected_gain_reads_percent_or_fraction() -> None:
    assert cs.parse_gain("+300%") == pytest.approx(3.0) and cs.parse_gain("0.5") == 0.5
    with pytest.raises(ConfigError, match="--expected"):
        cs.parse_gain("a lot")


def _fake(times: dict[str, list[list[float]]]):
    """A runner that hands out each script's next run's step times, and records the order it was asked in."""
    calls: list[str] = []

    def runner(command: Sequence[str], warmup: int, steps: int) -> cs.Run:
        name = command[1]
        calls.append(name)
        return cs.Run(name, "DataLoader", times[name].pop(0), True)

    return runner, calls


def test_rounds_rotate_and_the_gain_is_a_over_b(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("")
    a, b = ["python", str(tmp_path / "a.py")], ["python", str(tmp_path / "b.py")]
    runner, calls = _fake(
        {
            str(tmp_path / "a.py"): [[0.100, 0.100], [0.110, 0.110], [0.090, 0.090], [0.100, 0.100]],
            str(tmp_path / "b.py"): [[0.050, 0.050], [0.052, 0.052], [0.048, 0.048], [0.050, 0.050]],
        }
    )
    result = cs.compare_scripts(a, b, rounds=4, steps=2, expected=1.2, runner=runner)
    assert [Path(c).name for c in calls] == ["a.py", "b.py", "b.py", "a.py", "a.py", "b.py", "b.py", "a.py"]
    ratios = [0.100 / 0.050, 0.110 / 0.052, 0.090 / 0.048, 0.100 / 0.050]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    assert result.gain == pytest.approx(math.exp(mean) - 1)
    stdev = math.sqrt(sum((g - mean) ** 2 for g in logs) / 3)
    assert result.noise == pytest.approx(math.exp(mean) * 2 * stdev / 2)
    text = str(result)
    assert f"gain of B over A: {result.gain:+.0%}" in text and "beyond noise" in text and "+100%" in text
    assert "expected (what fix measured): +120%" in text and f"{result.gain / 1.2:.0%} of it" in text and "it holds" in text
    assert result.to_dict()["gain"] == pytest.approx(result.gain)


def test_a_gain_short_of_the_expected_does_not_hold(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("")
    runner, _ = _fake({str(tmp_path / "a.py"): [[0.1, 0.1]] * 2, str(tmp_path / "b.py"): [[0.08, 0.08]] * 2})
    result = cs.compare_scripts(
        ["python", str(tmp_path / "a.py")], ["python", str(tmp_path / "b.py")], rounds=2, expected=3.0, runner=runner
    )
    assert result.gain == pytest.approx(0.25) and "it does not hold" in str(result)  # no spread: the noise is 0


def test_a_gap_within_noise_is_not_called_either_way(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("")
    runner, _ = _fake({str(tmp_path / "a.py"): [[0.1, 0.1]] * 4, str(tmp_path / "b.py"): [[0.05, 0.05], [0.1, 0.1]] * 2})
    result = cs.compare_scripts(
        ["python", str(tmp_path / "a.py")], ["python", str(tmp_path / "b.py")], rounds=4, expected=0.8, runner=runner
    )
    assert abs(result.gain - 0.8) > 0.25 * 0.8 and abs(result.gain - 0.8) <= result.noise
    assert "not shown either way" in str(result) and "by less than this run's noise" in str(result)


def test_a_gap_inside_the_band_is_not_called_held_when_the_noise_is_wider(tmp_path: Path) -> None:
    # the per-round gains are +100% and 0%, alternating: the mean is near the expected +40%, but the noise is far
    # wider than 25% of it, so the run cannot say the gain held
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("")
    runner, _ = _fake({str(tmp_path / "a.py"): [[0.1, 0.1]] * 4, str(tmp_path / "b.py"): [[0.05, 0.05], [0.1, 0.1]] * 2})
    result = cs.compare_scripts(
        ["python", str(tmp_path / "a.py")], ["python", str(tmp_path / "b.py")], rounds=4, expected=0.4, runner=runner
    )
    assert abs(result.gain - 0.4) <= 0.25 * 0.4 < result.noise
    assert "not shown either way" in str(result) and "it holds" not in str(result) and "is wider than 25% of it" in str(result)


def test_missing_script_is_one_line() -> None:
    with pytest.raises(ConfigError, match="no script"):
        cs.compare_scripts(["python", "no_such_script.py"], ["python", "no_such_script.py"], rounds=1)


class _Loader:
    batch_size, num_workers = 4, 0


def test_timer_skips_each_epochs_first_batch_and_the_warmup() -> None:
    timer = cs._Timer(warmup=1, steps=3)
    loader = _Loader()
    assert list(timer.wrap(loader, iter(range(3)))) == [0, 1, 2]  # epoch 1: two intervals
    with pytest.raises(cs._Done):
        for _ in timer.wrap(loader, iter(range(10))):  # epoch 2: the first batch starts a new chain
            pass
    result = timer.result()
    assert result["complete"] and result["epochs"] == 2 and len(result["step_s"]) == 3


@pytest.mark.slow
def test_two_scripts_timed_in_their_own_loops(tmp_path: Path) -> None:
    """The real child processes: a script against itself, two rounds; each run times its steps."""
    import numpy as np
    from PIL import Image

    for label in range(2):
        folder = tmp_path / "images" / f"class_{label}"
        folder.mkdir(parents=True)
        for index in range(16):
            Image.fromarray(np.full((24, 32, 3), 40 * index % 255, dtype=np.uint8)).save(folder / f"{index}.jpg")
    shutil.copy(SCRIPTS / "patch_in_function.py", tmp_path / "train.py")
    command = [sys.executable, str(tmp_path / "train.py"), str(tmp_path / "images"), "--workers", "0", "--steps", "100"]
    result = cs.compare_scripts(command, command, rounds=2, warmup=1, steps=4)
    for pair in result.rounds:
        for run in pair:
            assert run.error is None and run.complete and len(run.step_s) == 4 and run.loader.startswith("DataLoader")
    assert math.isfinite(result.gain) and math.isfinite(result.noise)
