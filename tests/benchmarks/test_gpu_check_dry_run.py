"""benchmarks/gpu_check.py without a GPU: the budget's split between phases, the cut that keeps a partial output,
"skipped: no CUDA", and the table. The whole dry run (``FASTPIPE_GPU_CHECK_DEVICE=sim:290 benchmarks/gpu_check.sh``)
takes minutes; these take a few seconds."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def check() -> ModuleType:
    return load_benchmark("gpu_check")


def test_a_phase_gets_its_cap_or_what_the_later_floors_leave(check: ModuleType) -> None:
    assert check.allot(400, cap_s=90, floors_after_s=200, tail_s=10) == 90
    assert check.allot(250, cap_s=90, floors_after_s=200, tail_s=10) == 40
    assert check.allot(100, cap_s=90, floors_after_s=200, tail_s=10) == 0


class FakeClock:
    """A clock that a fake runner moves forward by the seconds each phase 'took'."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_runner(clock: FakeClock, took: dict[str, float], seen: dict[str, float]):
    def run(command, limit_s, log_path, *, reader=None):
        key = Path(log_path).stem
        seen[key] = limit_s
        spent = min(took[key], limit_s)
        clock.now += spent
        return (0 if took[key] <= limit_s else 130), spent, took[key] > limit_s, []

    return run


def phase(check: ModuleType, key: str, cap: float, floor: float, needs_cuda: bool = False):
    return check.Phase(key, key, ["true"], cap, floor, needs_cuda=needs_cuda)


def test_the_phases_share_the_budget_and_the_table_always_fits(check: ModuleType, tmp_path: Path) -> None:
    """Slow phases are cut at their limit; the last gets what is left; every later floor is kept; all within budget."""
    phases = [
        phase(check, "tests", 90, 40, needs_cuda=True),
        phase(check, "compare", 90, 30),
        phase(check, "article", 70, 30),
        phase(check, "demo", 300, 60),
    ]
    clock, seen = FakeClock(), {}
    took = {"tests": 20, "compare": 500, "article": 10, "demo": 500}
    runs = check.run_phases(phases, 400, tmp_path, cuda=True, clock=clock, runner=fake_runner(clock, took, seen), tail_s=10)
    assert seen == {"tests": 90, "compare": 90, "article": 70, "demo": 400 - 20 - 90 - 10 - 10}
    assert [r.status for r in runs] == ["ok", "cut: SIGINT at 76 s of its 90", "ok", "cut: SIGINT at 250 s of its 270"]
    assert clock.now <= 400 - 10, "the table's tail is left"


def test_no_cuda_skips_what_needs_it_and_gives_its_time_to_the_rest(check: ModuleType, tmp_path: Path) -> None:
    phases = [phase(check, "tests", 90, 40, needs_cuda=True), phase(check, "compare", 90, 30), phase(check, "demo", 300, 60)]
    clock, seen = FakeClock(), {}
    runs = check.run_phases(
        phases, 120, tmp_path, cuda=False, clock=clock, runner=fake_runner(clock, {"compare": 5, "demo": 5}, seen), tail_s=10
    )
    assert runs[0].status == "skipped: no CUDA" and "tests" not in seen
    assert seen["compare"] == 120 - 60 - 10, "the skipped phase's floor is not held back"
    assert [r.status for r in runs[1:]] == ["ok", "ok"]


def test_a_phase_with_no_time_left_is_skipped_and_said(check: ModuleType, tmp_path: Path) -> None:
    phases = [phase(check, "compare", 90, 30), phase(check, "article", 70, 30), phase(check, "demo", 300, 60)]
    clock, seen = FakeClock(), {}
    took = {"compare": 1000, "article": 1000, "demo": 1000}
    runs = check.run_phases(phases, 110, tmp_path, cuda=True, clock=clock, runner=fake_runner(clock, took, seen), tail_s=10)
    assert runs[0].status.startswith("skipped: no time left"), "10 s for compare is under its floor of 30 s"
    table = check.format_table(runs, "test machine", "cuda", 110, clock.now)
    assert "no time left for: compare" in table and "FAILED" not in table


@pytest.fixture
def sigint_ignored():
    """This process with SIGINT ignored, as a command started in the background (``cmd &``) is: its children inherit it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_cut_keeps_the_partial_output_and_the_group_is_killed(check: ModuleType, tmp_path: Path, sigint_ignored: None) -> None:
    """SIGINT first (a fastpipe command writes its partial report then), SIGKILL for what ignores it; the child gets
    SIGINT's default back even where the check was started with it ignored (the first dry run's cut lost everything)."""
    polite = (
        "import sys, time\n"
        "print('measured point 1', flush=True)\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('partial report: 1 point', flush=True); sys.exit(130)\n"
    )
    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('started', flush=True)\ntime.sleep(60)\n"
    for name, code, limit in (("polite", polite, 4.0), ("stubborn", stubborn, 4.0)):
        log = tmp_path / f"{name}.log"
        returncode, wall, cut, _ = check.run_limited([sys.executable, "-c", code], limit, log, echo=False)
        assert cut and wall < limit + 2, (name, wall)
        text = log.read_text()
        if name == "polite":
            assert returncode == 130 and "measured point 1" in text and "partial report: 1 point" in text
        else:
            assert returncode == -9 and "started" in text


def test_a_quick_command_is_not_cut(check: ModuleType, tmp_path: Path) -> None:
    returncode, wall, cut, samples = check.run_limited(
        [sys.executable, "-c", "print('done')"], 30, tmp_path / "q.log", reader=lambda: 50.0, interval_s=0.01, echo=False
    )
    assert (returncode, cut) == (0, False) and (tmp_path / "q.log").read_text().strip() == "done"


def test_figures_read_what_the_phases_write(check: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "t.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_ops" name="a"/><testcase classname="tests.test_x" name="b"><failure/></testcase>'
        "</testsuite></testsuites>"
    )
    assert check.tests_figure(tmp_path / "t.xml") == "3 passed, 1 failed, 1 skipped (test_x::b)"
    compare = {
        "device_bound_steps_per_s": 6.9,
        "variants": [{"name": "naive", "fraction_of_bound": 0.225}, {"name": "optimized", "fraction_of_bound": 0.996}],
    }
    (tmp_path / "c.json").write_text(json.dumps(compare))
    assert check.compare_figure(tmp_path / "c.json") == "naive 22% -> optimized 100% of the bound (6.90 steps/s)"
    report = {
        "workload": "toy:naive",
        "device_bound_steps_per_s": 6.9,
        "verdict": "highly input-bound",
        "interrupted": True,
        "experiments": [{"name": "baseline", "cache_point": None, "steps_per_s": 1.6, "fraction_of_bound": 0.232}],
        "bottlenecks": [{"stage": "raw load"}, {"stage": "RandomMask"}],
    }
    (tmp_path / "d.json").write_text(json.dumps(report))
    assert check.diagnosis_figure(tmp_path / "d.json") == (
        "partial report (interrupted): baseline 23% of the bound; highly input-bound; names raw load, RandomMask"
    )


def test_the_machine_is_named_in_the_results_folder(check: ModuleType) -> None:
    assert check.machine_slug({"gpu": "NVIDIA H200", "cores": 16}) == "h200"
    assert check.machine_slug({"gpu": "NVIDIA A10G", "cores": 4}) == "a10g"
    assert check.machine_slug({"gpu": None, "cores": 2}) == "nogpu-2cores"


def test_the_gpu_tests_phase_lists_the_files_with_gpu_tests(check: ModuleType) -> None:
    files = check.gpu_test_files()
    assert (
        "tests/diagnosis/ladder/test_measure_gpu.py" in files
        and "tests/loading/test_prefetch_gpu.py" in files
        and "tests/ops/test_ops.py" in files
    )
    assert "tests/benchmarks/test_gpu_check_dry_run.py" not in files


def test_a_phase_cut_before_writing_its_result_says_so(check: ModuleType, tmp_path: Path) -> None:
    cut = check.Phase("compare_toy", "compare toy", ["true"], 90, 30, figure=check._reads("compare_toy.json", check.compare_figure))
    clock, seen = FakeClock(), {}
    runs = check.run_phases([cut], 200, tmp_path, cuda=True, clock=clock, runner=fake_runner(clock, {"compare_toy": 500}, seen), tail_s=10)
    assert runs[0].status.startswith("cut: SIGINT at")
    assert runs[0].figure == "no compare_toy.json written before the cut; what it printed is in compare_toy.log"
