"""``fastpipe diagnose -- python SCRIPT``: the cache ladder inside an unmodified script's own loop.

The script (``tests/scripts/train_planted.py``) is written like PyTorch's ImageNet example, with a planted slow stage
(``SlowFilter``) and flags that plant the failure modes. Each run is in-process, as a user's ``fastpipe diagnose``
runs it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastpipe.cli import main

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_planted.py"
#: A short ladder: a few steps a point, a loose precision target, no extra passes.
QUICK = ["--no-memory", "--no-stage-costs", "--steps", "4", "--warmup", "1", "--precision", "0.2"]


def diagnose(capsys, *flags: str, script_args: list[str]) -> tuple[int, str, str]:
    code = main(["diagnose", *flags, "--", "python", str(SCRIPT), *script_args])
    out, err = capsys.readouterr()
    return code, out, err


# ----- what the training sees: the dry run and --then-continue -------------------------------
def _reference(tmp_path: Path, name: str, *args: str) -> dict:
    """The script run by plain python (no fastpipe), its model saved on exit."""
    path = tmp_path / name
    subprocess.run([sys.executable, str(SCRIPT), *args, "--save-on-exit", str(path)], check=True, capture_output=True, timeout=300)
    return torch.load(path)


def _same_model(a: dict, b: dict) -> bool:
    return all(torch.allclose(a["state_dict"][k], b["state_dict"][k], atol=1e-6) for k in a["state_dict"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dry_run_stops_the_script_with_its_model_as_it_was(tmp_path, capsys, clean) -> None:
    args = ["--samples", "400", "--slow-ms", "0", "--step-ms", "2", "--print-freq", "1000"]
    code, out, err = diagnose(
        capsys,
        *QUICK,
        "--budget-steps",
        "30",
        script_args=[*args, "--save-on-exit", str(tmp_path / "ladder.pt"), "--checkpoint", str(tmp_path / "ckpt.pt")],
    )
    print(err)
    assert code == 0
    assert "the script trains on replayed batches" in err and "then the script is stopped" in err
    assert "fastpipe diagnosis:" in out and "trained" not in out  # the report, then the script stopped mid-epoch
    assert not (tmp_path / "ckpt.pt").exists()  # its end-of-epoch checkpoint was never written
    saved = torch.load(tmp_path / "ladder.pt")
    # the ladder's steps ran through the script's loop: after its 5 real steps, at least the device point's and the
    # baseline's windows (1 warm-up + 4 steps each; a pipeline this fast stops there, not at the budget)
    assert saved["step"] >= 5 + 2 * (1 + 4)
    # what its finally block saved is the model after its 5 real steps: the ladder's training was undone
    assert _same_model(saved, _reference(tmp_path, "plain.pt", *args, "--stop-at", "5"))
    assert not _same_model(saved, _reference(tmp_path, "plain6.pt", *args, "--stop-at", "6"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_then_continue_resumes_training_from_the_state_the_script_had(tmp_path, capsys, clean) -> None:
    # 60 batches in its one epoch: 5 real ones, the ladder's (at most 30), then the real ones it would have had next,
    # up to the epoch's 60 (the epoch keeps its length: the real loader's last batches are not handed out)
    args = ["--samples", "480", "--slow-ms", "0", "--step-ms", "2", "--print-freq", "1000"]
    code, out, err = diagnose(
        capsys, *QUICK, "--budget-steps", "30", "--then-continue", script_args=[*args, "--save-on-exit", str(tmp_path / "c.pt")]
    )
    assert code == 0 and "fastpipe diagnosis:" in out and "then the script goes on with its real batches" in err
    continued = torch.load(tmp_path / "c.pt")
    assert continued["step"] == 60 and "trained 60 steps" in out
    ladder = int(re.search(r"took (\d+) steps of its loop", out).group(1))
    # the model as if the ladder had never run: real batches 1-5, then 6 to 60 - ladder, the loader's own order
    assert _same_model(continued, _reference(tmp_path, "plain.pt", *args, "--stop-at", str(60 - ladder)))
    assert not _same_model(continued, _reference(tmp_path, "plain_more.pt", *args, "--stop-at", str(61 - ladder)))


# ----- failure modes -------------------------------------------------------------------------
def test_script_that_never_iterates_says_so(capsys, clean) -> None:
    code, out, err = diagnose(capsys, *QUICK, script_args=["--no-train", "--samples", "16"])
    assert code == 2 and "nothing to train" in out
    assert "ended without iterating a DataLoader" in err and "fastpipe.stages.Stages(source=" in err


def _stopped_mid_ladder(out: str, err: str, why: str) -> bool:
    """The partial report says why it is partial, or, when the first point was not done yet, a line says so."""
    partial = "Interrupted: this report is partial." in out and f"The script {why}" in out
    return partial or (f"the script {why}" in err and "before the ladder measured its first point" in err)


#: A planted stage, so the ladder measures the points between device and baseline (the script stops among them).
MID = ["--samples", "400", "--slow-ms", "3", "--step-ms", "2"]


def test_crash_mid_ladder_shows_the_scripts_own_traceback(capsys, clean) -> None:
    code, out, err = diagnose(capsys, *QUICK, script_args=[*MID, "--crash-at", "12"])
    assert code == 1
    assert _stopped_mid_ladder(out, err, "raised RuntimeError: planted crash at step 12"), out + err
    traceback_text = err[err.index("Traceback") :]
    first_frame = traceback_text.splitlines()[1]
    assert str(SCRIPT) in first_frame  # the script's frame first: no runpy or fastpipe frames above it
    assert "RuntimeError: planted crash at step 12" in traceback_text


def test_sys_exit_message_reaches_the_user(capsys, clean) -> None:
    code, out, err = diagnose(capsys, *QUICK, script_args=[*MID, "--exit-at", "12"])
    assert code == 1
    assert "planted exit at step 12: out of patience" in err
    assert _stopped_mid_ladder(out, err, "exited (SystemExit"), out + err


def test_loop_that_ends_during_the_ladder_gets_a_partial_report(capsys, clean) -> None:
    code, out, err = diagnose(capsys, *QUICK, script_args=[*MID, "--stop-at", "12"])
    assert code == 0 and "trained 12 steps" in out
    assert _stopped_mid_ladder(out, err, "ended"), out + err


def test_ctrl_c_in_the_scripts_step_gives_the_partial_report(capsys, clean) -> None:
    code, out, err = diagnose(capsys, *QUICK, script_args=[*MID, "--interrupt-at", "12"])
    assert code == 130
    assert _stopped_mid_ladder(out, err, "was interrupted (Ctrl-C)"), out + err


@pytest.mark.slow
@pytest.mark.timeout(900)  # spawned workers import torch at each point: 2-3 min at load 8 on 2 cores
def test_loader_with_spawned_workers(capsys, clean) -> None:
    code, out, err = diagnose(capsys, *QUICK, "--budget-steps", "40", script_args=[*MID, "--spawn", "-j", "1"])
    assert code == 0 and "fastpipe diagnosis:" in out and "baseline" in out, out + err


# ----- the loop's own work on each batch, before its model ------------------------------------
LOOP = ["--samples", "400", "--slow-ms", "0", "--step-ms", "2", "--print-freq", "1000"]


def _loop_stage(out_json: Path) -> tuple[list[str], dict | None]:
    data = json.loads(out_json.read_text())
    part = next((p for p in data["main_process"]["parts"] if p["name"] == "loop work before the model"), None)
    return [b["stage"] for b in data["bottlenecks"]], part


def test_the_loops_own_work_before_the_model_is_named_as_the_main_processs(tmp_path, capsys, clean, one_thread) -> None:
    """10 ms of CPU on each batch in the script's loop, before its model: named as the loop's work, with its time. The
    ladder alone cannot: the work is in every point's step, the device point's too (on 2 busy cores it may still name
    the raw load, the workers competing with the CPU step for the cores, with or without the loop's work)."""
    code, out, err = diagnose(capsys, *QUICK, "--json", str(tmp_path / "r.json"), script_args=[*LOOP, "--loop-ms", "10"])
    assert code == 0, out + err
    named, part = _loop_stage(tmp_path / "r.json")
    assert "loop work before the model" in named, out
    assert 9 <= part["ms_per_step"] < 30, part
    assert "loop work before the model [main process]: costs" in out and "into the dataset's transforms" in out


def test_without_loop_work_no_loop_stage_is_named(tmp_path, capsys, clean, one_thread) -> None:
    code, out, err = diagnose(capsys, *QUICK, "--json", str(tmp_path / "r.json"), script_args=[*LOOP, "--loop-ms", "0"])
    assert code == 0, out + err
    named, part = _loop_stage(tmp_path / "r.json")
    assert "loop work before the model" not in named and part is not None and part["ms_per_step"] < 1.0, (named, part)


def test_script_mode_flags(capsys) -> None:
    assert main(["diagnose", "--device", "sim:50", "--", "python", str(SCRIPT)]) == 2
    assert "only where fastpipe owns the step" in capsys.readouterr().err
    assert main(["diagnose", "--loader", "0", "--", "python", str(SCRIPT)]) == 2
    assert "counts the script's DataLoaders from 1" in capsys.readouterr().err
    assert main(["diagnose", "--budget", "0", "--", "python", str(SCRIPT)]) == 2
    assert "seconds of measuring per point and must be > 0 (--budget)" in capsys.readouterr().err
    assert main(["diagnose", "--then-continue", "toy:naive"]) == 2
    assert "apply to a script" in capsys.readouterr().err
    assert main(["diagnose", "--", "python", "missing.py"]) == 2
    assert "no script 'missing.py'" in capsys.readouterr().err


# ----- the planted stage, against the factory's diagnosis of the same pipeline -----------------
PLANT = ["--samples", "4000", "--slow-ms", "30", "--step-ms", "5", "--print-freq", "1000", "-b", "8", "-j", "2"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two whole ladders: 5-10 min at load 10 on 2 cores
def test_plain_loop_names_the_planted_stage_as_the_factory_does(tmp_path, capsys, clean, one_thread) -> None:
    out_json = tmp_path / "script.json"
    started = time.perf_counter()
    code, out, err = diagnose(capsys, "--no-memory", "--precision", "0.1", "--json", str(out_json), script_args=PLANT)
    took = time.perf_counter() - started
    print(out, err, f"script mode took {took:.0f} s", sep="\n")
    assert code == 0
    script = json.loads(out_json.read_text())
    named = [b["stage"] for b in script["bottlenecks"]]
    assert named and named[0] == "SlowFilter", named

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import train_planted
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from fastpipe import diagnose as factory_diagnose

    args = train_planted.parser.parse_args(PLANT)
    model = train_planted.tiny(10)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()

    def step(batch):
        images, target = batch
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_ms / 1000)

    started = time.perf_counter()
    factory = factory_diagnose(
        train_planted.make_loader(args), step, "cpu", model=model, optimizer=optimizer, precision=0.1, progress=False
    ).to_dict()
    print(f"factory mode took {time.perf_counter() - started:.0f} s")
    print(json.dumps({"script": script["bottlenecks"][0], "factory": factory["bottlenecks"][0]}, indent=1, default=str))
    assert factory["bottlenecks"][0]["stage"] == "SlowFilter"
    a, b = script["bottlenecks"][0], factory["bottlenecks"][0]
    # the same stage's time per step, within the two measurements' noise (each noise_ms is two standard errors)
    assert abs(a["added_ms"] - b["added_ms"]) <= 1.5 * (a["noise_ms"] ** 2 + b["noise_ms"] ** 2) ** 0.5 + 0.1 * b["added_ms"]


# ----- through a framework's loop: Lightning's fetcher, the HF Trainer's accelerate DataLoaderShard ---------------
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole ladder through the framework's loop: 3-6 min at load 10 on 2 cores
@pytest.mark.parametrize(("script", "needs"), [("train_lightning.py", "lightning"), ("train_hf.py", "transformers")])
def test_framework_script_names_the_planted_stage(script, needs, tmp_path, capsys, clean, one_thread) -> None:
    pytest.importorskip(needs)
    out_json = tmp_path / "report.json"
    started = time.perf_counter()
    code = main(
        ["diagnose", "--no-memory", "--precision", "0.1", "--budget-steps", "1000", "--json", str(out_json), "--"]
        + ["python", str(SCRIPT.parent / script), "--slow-ms", "40"]
    )
    out, err = capsys.readouterr()
    print(out, err, f"{script}: {time.perf_counter() - started:.0f} s", sep="\n")
    report = json.loads(out_json.read_text())
    named = [b["stage"] for b in report["bottlenecks"]]
    assert code == 0 and named and named[0] == "SlowFilter", named
    assert "done" not in out  # a dry run: fit/train never returned


# ----- which loader is the training loader -------------------------------------------------------
def test_a_validation_pass_first_does_not_take_the_ladder(capsys, clean) -> None:
    # 6 validation batches, then 50 training batches: the validation loader delivers its 5 batches first
    code, out, err = diagnose(capsys, *QUICK, script_args=[*MID, "--val-samples", "48", "--validate-first", "--stop-at", "12"])
    assert code == 0 and "trained 12 steps" in out
    announcement = next(line for line in err.splitlines() if "the cache ladder starts" in line)
    assert "at batch 6 of DataLoader #2" in announcement, announcement  # the training loader, iterated second
    assert "50 batches an epoch, the longest epoch of the script's 2 DataLoaders (DataLoader #1: 6)" in announcement
    assert "--loader N picks the Nth the script iterates" in announcement


def test_training_loader_chosen_across_alternating_train_and_validation_epochs(capsys, clean) -> None:
    # 8 training batches an epoch, each followed by 6 validation batches, and a validation pass before the first
    # (the ImageNet example's order with a baseline accuracy first): the whole ladder runs on the training loader
    args = ["--samples", "64", "--val-samples", "48", "--validate-first", "--epochs", "3", "--slow-ms", "0", "--step-ms", "2"]
    code, out, err = diagnose(capsys, *QUICK, "--budget-steps", "20", script_args=args)
    assert code == 0, out + err
    assert "at batch 6 of DataLoader #2" in err and "the longest epoch" in err
    assert "fastpipe diagnosis:" in out and "on DataLoader #2" in out
    # its epochs were kept: the first ended after its 8 batches during the ladder, and its validation pass ran
    assert out.count("* Acc@1") >= 2 and "the script's epochs were kept" in out


def test_loader_flag_still_picks_the_validation_loader(capsys, clean) -> None:
    code, out, err = diagnose(
        capsys, *QUICK, "--loader", "1", "--budget-steps", "12", script_args=[*MID, "--val-samples", "48", "--validate-first"]
    )
    assert "at batch 6 of DataLoader #1" in err and "--loader 1" in err, err


UNUSED_LONG = SCRIPT.parent / "train_unused_long.py"


def test_a_longer_loader_never_iterated_gives_way_at_the_next_epoch(capsys, clean) -> None:
    code = main(["diagnose", *QUICK, "--budget-steps", "40", "--", "python", str(UNUSED_LONG), "3"])
    out, err = capsys.readouterr()
    assert code == 0 and "fastpipe diagnosis:" in out, out + err
    assert "DataLoader #1" in err and "began its next epoch while its longer DataLoaders (one not iterated yet: 100)" in err


def test_waiting_for_a_longer_loader_that_never_comes_says_how_to_pick(capsys, clean) -> None:
    code = main(["diagnose", *QUICK, "--", "python", str(UNUSED_LONG), "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "passed over for a longer DataLoader it holds (100 batches an epoch)" in err and "--loader 1" in err, err


# ----- through timm's PrefetchLoader (create_loader with the prefetcher on, timm's default) -------------------------
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole ladder: 45-60 s at load 6 on 2 cores
def test_timm_prefetch_loader_script_names_the_planted_stage(tmp_path, capsys, clean, one_thread) -> None:
    pytest.importorskip("timm")
    out_json = tmp_path / "report.json"
    started = time.perf_counter()
    code = main(
        ["diagnose", "--no-memory", "--precision", "0.1", "--json", str(out_json), "--"]
        + ["python", str(SCRIPT.parent / "train_timm.py"), "--slow-ms", "30"]
    )
    out, err = capsys.readouterr()
    print(out, err, f"train_timm.py: {time.perf_counter() - started:.0f} s", sep="\n")
    assert "loader: PrefetchLoader" in out  # the script iterated timm's prefetcher, not a DataLoader
    report = json.loads(out_json.read_text())
    named = [b["stage"] for b in report["bottlenecks"]]
    assert code == 0 and named and named[0] == "SlowFilter", named
    assert "done" not in out  # a dry run: its epoch never ended


# ----- a loop with no DataLoader: what it reads its batches from is named ---------------------------------------
NANOGPT = SCRIPT.parent / "train_nanogpt.py"


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(NANOGPT.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("command", ["diagnose", "watch"])
def test_get_batch_loop_names_get_batch_and_its_declaration(command, tmp_path, capsys, clean) -> None:
    flags = QUICK if command == "diagnose" else []
    code = main([command, *flags, "--", "python", str(NANOGPT), "--data-dir", str(tmp_path), "--max-iters", "40"])
    err = capsys.readouterr().err
    assert code == (2 if command == "diagnose" else 0), err
    prefetch = _line_of("# prefetch the next batch")
    call_site = f"train_nanogpt.py:{prefetch}"
    feeder = next(line for line in err.splitlines() if "whose results the loop passes on" in line)
    assert feeder.lstrip().startswith("- get_batch (the function it calls") and call_site in feeder, err
    assert f"train_nanogpt.py:{_line_of('def get_batch')}, called at" in feeder
    assert "- step (the function it calls;" in err  # the model's step: named, not taken for the batches
    assert "self.stages = fastpipe.stages.Stages(source=<the raw items get_batch reads" in err
    assert "iterate it in place of get_batch(...) at" in err and call_site in err.split("in place of")[-1]


def test_generator_loop_names_the_generator(tmp_path, capsys, clean) -> None:
    code = main(["diagnose", *QUICK, "--", "python", str(NANOGPT), "--data-dir", str(tmp_path), "--max-iters", "40", "--generator"])
    err = capsys.readouterr().err
    assert code == 2
    feeder = next(line for line in err.splitlines() if "whose results the loop passes on" in line)
    assert feeder.lstrip().startswith("- batches (the generator it iterates") and f":{_line_of('def batches')}," in feeder, err
    assert "get_batch" not in feeder and "- get_batch" not in err  # inside the generator: part of it, not a second source
    assert "in place of the loop over batches(...)" in err


@pytest.mark.slow  # a timed ladder whose step is the script's CPU step: at load 7 collate/IPC's noise ranked first
def test_the_printed_declaration_gives_the_ladder(tmp_path, capsys, clean, one_thread) -> None:
    # the script's --declared loop is the declaration printed for get_batch, filled in: the ladder runs and names the
    # planted wait (5 ms a sample) among the declared stages
    out_json = tmp_path / "report.json"
    args = ["--data-dir", str(tmp_path), "--declared", "--max-iters", "100000", "--slow-ms", "5"]
    # with the in-worker timing (rule 4): on a loaded machine the ladder alone can be too noisy to name it
    quick_with_costs = [arg for arg in QUICK if arg != "--no-stage-costs"]
    code = main(["diagnose", *quick_with_costs, "--json", str(out_json), "--", "python", str(NANOGPT), *args])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    report = json.loads(out_json.read_text())
    assert [b["stage"] for b in report["bottlenecks"]][:1] == ["SlowDisk"], out
    assert "after read_window" in out  # the declared stages are cache points
