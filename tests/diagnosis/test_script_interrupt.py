"""Script mode on the way out (issue 38, item 5): Ctrl-C, crashes, ``--help`` and output paths.

* Ctrl-C sent to the process group (as a terminal sends it) about 1 s into the ladder hung 60 s in 3 of 7 runs, then
  "no report", and left a ``pymp-*/listener-*`` folder in the temp folder: each run here starts
  ``python -m fastpipe diagnose -- python SCRIPT`` in a session of its own, sends SIGINT to the group, and checks it
  ended within seconds with a partial report (or the line saying no point was measured yet), exit 130, nothing new in
  its private TMPDIR or in /dev/shm, and that what the script saved in its ``finally:`` is its state from before
  the ladder;
* a script that crashes during the ladder saves, in its ``finally:``, its own state (the one it had when the ladder
  took over), not the ladder's;
* ``-- python train.py --help`` exits 0 as python does, with no advice;
* an output path that cannot be created is refused before the script runs.

The script is ``tests/scripts/train_epochs_counted.py``: ``--trace`` saves its model and optimizer before each step,
so the test knows the state before the ladder's first step (after 5 real steps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from fastpipe.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_epochs_counted.py"
ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--no-memory", "--no-stage-costs", "--steps", "4", "--warmup", "1", "--precision", "0.2"]
#: 50 batches an epoch, a step of 20 ms or more: the ladder is still running a second after it starts
LONG = ["--samples", "400", "--epochs", "5", "--step-ms", "20"]
PAUSE_S = 1.0
#: what "ends within seconds" means here, on 2 shared cores (the hang it replaces lasted 60 s)
ENDS_WITHIN_S = 8.0


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_optimizer(a: dict, b: dict) -> bool:
    return (
        a["param_groups"] == b["param_groups"]
        and all(_same(a["state"][i], b["state"][i]) for i in a["state"])
        and a["state"].keys() == b["state"].keys()
    )


def _saved_is_before_ladder(saved_path: Path, trace_path: Path) -> tuple[bool, bool]:
    """(what the script saved on exit is its state before the ladder's first step, the ladder had trained it since)."""
    saved, trace = torch.load(saved_path), torch.load(trace_path)
    _, model_before, optimizer_before = trace[5]
    trained = any(not _same(model_before, model) for _, model, _ in trace[6:])
    return _same(saved["model"], model_before) and _same_optimizer(saved["optimizer"], optimizer_before), trained


def _partial(out: str, err: str, why: str) -> bool:
    """The report, saying why it is partial; or the line saying the script left before the first point was measured."""
    reported = "fastpipe diagnosis:" in out and why.lower() in out.lower()
    return reported or f"the script {why} before the ladder measured its first point" in err


# ----- a crash during the ladder -------------------------------------------------------------------
def test_a_crash_during_the_ladder_saves_the_scripts_own_state(tmp_path, capsys) -> None:
    saved, trace = tmp_path / "saved.pt", tmp_path / "trace.pt"
    args = [*LONG, "--step-ms", "0", "--crash-at", "15", "--save-on-exit", str(saved), "--trace", str(trace)]
    code = main(["diagnose", *QUICK, "--", "python", str(SCRIPT), *args])
    out, err = capsys.readouterr()
    assert code == 1 and "RuntimeError: planted crash at step 15" in err
    # the crash came during the ladder (5 real steps, then the ladder's)
    assert _partial(out, err, "raised RuntimeError: planted crash at step 15"), out + err
    before, trained = _saved_is_before_ladder(saved, trace)
    assert trained  # the ladder's 10 steps changed the weights the script trained on...
    assert before  # ...and its finally: saved its own, from before the ladder


# ----- --help, and other ways out before any loader -------------------------------------------------
def test_the_scripts_help_exits_as_python_does(capsys) -> None:
    code = main(["diagnose", "--", "python", str(SCRIPT), "--help"])
    out, err = capsys.readouterr()
    assert code == 0 and "usage: train_epochs_counted.py" in out
    assert err == ""  # no fastpipe advice


def test_an_argument_error_exits_as_python_does(capsys) -> None:
    plain = subprocess.run([sys.executable, str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=120)
    code = main(["diagnose", "--", "python", str(SCRIPT), "--bogus"])
    err = capsys.readouterr().err
    assert code == plain.returncode == 2
    assert "unrecognized arguments: --bogus" in err and "fastpipe" not in err


# ----- output paths ----------------------------------------------------------------------------------
def test_an_output_path_that_cannot_be_created_is_refused_before_the_script_runs(tmp_path, capsys) -> None:
    saved = tmp_path / "saved.pt"
    code = main(["diagnose", "--json", "/proc/x.json", "--", "python", str(SCRIPT), "--save-on-exit", str(saved)])
    err = capsys.readouterr().err
    assert code == 2 and "--json /proc/x.json cannot be written" in err and "Traceback" not in err
    assert not saved.exists()  # refused before the script ran


def test_proving_an_output_path_leaves_nothing_behind(tmp_path, capsys) -> None:
    mine = tmp_path / "mine.md"
    mine.write_text("kept")
    new = tmp_path / "a" / "b" / "report.json"
    code = main(["diagnose", "--json", str(new), "--markdown", str(mine), "--", "python", str(SCRIPT), "--help"])
    assert code == 0
    # the script ended before any report: the file made to prove the path and its folders are gone, an existing
    # file is kept as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.md"] and mine.read_text() == "kept"


# ----- Ctrl-C to the process group --------------------------------------------------------------------
def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _tree(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _ctrl_c_run(tmp_path: Path) -> dict:
    """One run: ``fastpipe diagnose`` in a session of its own, SIGINT to its group ``PAUSE_S`` into the ladder."""
    private = tmp_path / "tmp"
    private.mkdir()
    saved, trace = tmp_path / "saved.pt", tmp_path / "trace.pt"
    env = dict(os.environ, TMPDIR=str(private), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "fastpipe", "diagnose", "--", "python", str(SCRIPT), *LONG]  # the default flags
    command += ["--save-on-exit", str(saved), "--trace", str(trace)]
    shm_before = _shm_entries()
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err_file:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err_file, env=env, start_new_session=True, text=True)
        deadline = time.monotonic() + 120
        pids = {process.pid}
        while "the cache ladder starts" not in errors.read_text():
            assert process.poll() is None and time.monotonic() < deadline, errors.read_text()
            pids |= _tree(process.pid)
            time.sleep(0.02)
        until = time.monotonic() + PAUSE_S
        while time.monotonic() < until:
            pids |= _tree(process.pid)
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)
        sent = time.monotonic()
        try:
            out, _ = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
        took = time.monotonic() - sent
    time.sleep(0.5)  # the last workers' exit
    return {
        "code": process.returncode,
        "took": took,
        "out": out,
        "err": errors.read_text(),
        "left": sorted(n for n in os.listdir(private) if not n.startswith("torchinductor_")),  # torch's cache folder
        # torch names its shared memory torch_<pid>_...: this run's processes' (others' come and go on this machine)
        "shm": sorted(n for n in _shm_entries() - shm_before if n.startswith(tuple(f"torch_{pid}_" for pid in pids))),
        "saved": saved,
        "trace": trace,
    }


def _check_ctrl_c(run: dict) -> None:
    out, err = run["out"], run["err"]
    assert run["code"] == 130, err[-3000:]
    assert run["took"] < ENDS_WITHIN_S, f"ended {run['took']:.1f} s after SIGINT"
    assert _partial(out, err, "was interrupted (Ctrl-C)"), out + err
    assert run["left"] == [] and run["shm"] == [], (run["left"], run["shm"], err[-2000:])
    before, _ = _saved_is_before_ladder(run["saved"], run["trace"])
    assert before  # what its finally: saved is its state from before the ladder


def test_ctrl_c_to_the_process_group_ends_in_seconds_with_the_partial_report(tmp_path) -> None:
    run = _ctrl_c_run(tmp_path)
    print(f"ended {run['took']:.2f} s after SIGINT")
    _check_ctrl_c(run)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(10))
def test_ctrl_c_to_the_process_group_ten_times(attempt, tmp_path) -> None:
    run = _ctrl_c_run(tmp_path)
    print(f"run {attempt}: exit {run['code']}, ended {run['took']:.2f} s after SIGINT")
    _check_ctrl_c(run)


def test_ctrl_c_during_the_loader_memory_pass_stops_it(monkeypatch, capsys) -> None:
    # the loader's memory pass takes no step of the script, so it never saw the script go and ran to its budget (20 s):
    # a Ctrl-C sent as it starts must end the run in seconds, with the ladder's report
    from fastpipe.diagnosis.memory import _section

    measure, sent = _section.measure_loader_memory, []

    def interrupted_at_start(*args, **kwargs):
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # lands in the script's thread, waiting for its next batch
        return measure(*args, **kwargs)

    monkeypatch.setattr(_section, "measure_loader_memory", interrupted_at_start)
    flags = ["--no-stage-costs", "--steps", "4", "--warmup", "1", "--precision", "0.2", "--budget-steps", "200"]
    code = main(["diagnose", *flags, "--", "python", str(SCRIPT), "--samples", "400", "--epochs", "20"])
    ended = time.monotonic()
    out, err = capsys.readouterr()
    assert sent, "the memory pass never started (a budget stop skips it): " + out + err
    assert code == 130 and ended - sent[0] < ENDS_WITHIN_S, f"ended {ended - sent[0]:.1f} s after SIGINT"
    assert _partial(out, err, "was interrupted (Ctrl-C)"), out + err
