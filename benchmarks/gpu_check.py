"""The GPU check's phases, each capped from what is left of one wall-clock budget, then one table (issue 39).

``benchmarks/gpu_check.sh`` is the command to run; it checks that fastpipe imports and runs this. Phases, in order:

1. ``gpu tests``: ``pytest -m gpu`` on the test files that have GPU tests;
2. ``corpus``: the real-photo JPEG corpus the jpeg phases read (built once, then cached);
3. ``compare toy`` and 4. ``compare jpeg``: ``fastpipe compare`` on the device;
5. ``script mode``: ``fastpipe diagnose -- python tests/scripts/train_planted.py`` (it trains on CUDA when present);
6. ``article table``: ``benchmarks/reproduce_article.py --device DEVICE``;
7. ``loaders``: the thread loader against the DataLoader at 4, 8 and 16 threads/workers (``gpu_loaders.py``);
8. ``decode``: nvjpeg against the CPU decode-crop op, images/s (``gpu_decode.py``);
9. ``collate``: ``bench_collate.py`` (stock against recycled collate and pinning);
10. ``demo``: ``make demo``'s diagnosis, ``fastpipe diagnose toy:naive`` at its defaults, last, with whatever is left.

Time: phase i gets ``min(cap_i, left - sum of the floors of the phases after it - tail)``; a phase whose share is
under its own floor is skipped ("skipped: no time left"), so the table always prints within the budget. At its
limit a phase is sent SIGINT (fastpipe's commands then print and write a partial report, pytest its summary),
and its whole process group SIGKILL a grace period later; its log keeps what it printed. A phase that needs CUDA
on a machine without it is "skipped: no CUDA" and takes nothing from the budget.

Results: every phase's log and JSON, ``gpu_check.json`` and ``gpu_check.txt`` (the table) in ``--results``. The
table names the machine (GPU, usable cores, torch). Standard library (and gpu_table.py) in this process; torch is
asked about the machine in a subprocess, so a broken CUDA cannot hang the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_table  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parent.parent
#: Seconds kept after the last phase for the table (and the caller's tarball).
TAIL_S = 10.0
#: The default budget: the table is out within 7 minutes of the start on the 16-core H200 host.
DEFAULT_BUDGET_S = 400.0


@dataclass
class Phase:
    """One step of the check: a command, its cap and floor (seconds), and how to read its result."""

    key: str
    title: str
    command: list[str]
    cap_s: float
    floor_s: float
    needs_cuda: bool = False
    figure: Callable[[Path], str] | None = None
    """The phase's headline figure from the files it wrote (results folder in), or "" when there is none."""


@dataclass
class PhaseRun:
    """What happened to one phase: its row of the table."""

    key: str
    title: str
    status: str
    returncode: int | None = None
    wall_s: float = 0.0
    limit_s: float = 0.0
    figure: str = ""
    gpu_util: list[float] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """It ran and failed; a phase cut at its limit (partial output kept) or skipped has not failed."""
        return self.status.startswith("failed")


def allot(left_s: float, cap_s: float, floors_after_s: float, tail_s: float = TAIL_S) -> float:
    """Seconds the next phase may run: its cap, or less, so that every later phase keeps its floor and the table its tail."""
    return max(0.0, min(cap_s, left_s - floors_after_s - tail_s))


def grace_for(limit_s: float) -> float:
    """Seconds between SIGINT and SIGKILL: room for a partial report, inside the phase's own limit."""
    return min(20.0, max(3.0, 0.15 * limit_s))


def run_limited(
    command: Sequence[str],
    limit_s: float,
    log_path: Path,
    *,
    reader: gpu_table.Reader | None = None,
    interval_s: float = 0.5,
    echo: bool = True,
) -> tuple[int, float, bool, list[float]]:
    """Run ``command`` for at most ``limit_s``; returns (exit status, wall seconds, cut short, GPU utilisation samples).

    Output goes to ``log_path`` as it comes (and to stdout with ``echo``), so a run cut short keeps what it
    printed. At ``limit_s - grace`` the command gets SIGINT, alone (its DataLoader workers are its to stop);
    whatever of its process group is left at ``limit_s`` gets SIGKILL.
    """
    grace = grace_for(limit_s)
    samples: list[float] = []
    stop = threading.Event()
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            preexec_fn=_default_sigint,
        )

        def copy() -> None:
            assert child.stdout is not None
            for line in iter(child.stdout.readline, b""):
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()

        def sample() -> None:
            while reader is not None and not stop.wait(interval_s):
                try:
                    samples.append(reader())
                except Exception:  # a failed read is a gap in the samples, not a failed phase
                    pass

        threads = [threading.Thread(target=copy, daemon=True), threading.Thread(target=sample, daemon=True)]
        for thread in threads:
            thread.start()
        cut = False
        try:
            child.wait(timeout=max(0.0, limit_s - grace))
        except subprocess.TimeoutExpired:
            cut = True
            _signal_child(child, signal.SIGINT)
            try:
                child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(child)  # what the command left behind (workers, a hung child) goes with it
        child.wait()
        stop.set()
        threads[0].join(timeout=5)
        threads[1].join(timeout=5)
    return child.returncode, time.perf_counter() - start, cut, samples


def _default_sigint() -> None:
    """In the child, before exec: SIGINT back to its default. A command started in the background (``cmd &``, as a
    remote runner starts it) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: the cut would
    find nothing to write its partial report and end at SIGKILL, output lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_child(child: subprocess.Popen, sig: int) -> None:
    try:
        child.send_signal(sig)
    except ProcessLookupError:
        pass


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def status_of(returncode: int, cut: bool, limit_s: float) -> str:
    if cut:
        return f"cut: SIGINT at {limit_s - grace_for(limit_s):.0f} s of its {limit_s:.0f}"
    return "ok" if returncode == 0 else f"failed (exit {returncode})"


def run_phases(
    phases: list[Phase],
    budget_s: float,
    results: Path,
    *,
    cuda: bool,
    reader: gpu_table.Reader | None = None,
    clock: Callable[[], float] = time.perf_counter,
    runner: Callable[..., tuple[int, float, bool, list[float]]] = run_limited,
    tail_s: float = TAIL_S,
) -> list[PhaseRun]:
    """Run ``phases`` in order within ``budget_s`` from now; one :class:`PhaseRun` each, skipped ones included."""
    began = clock()
    runnable = [p for p in phases if cuda or not p.needs_cuda]
    runs = []
    for phase in phases:
        if phase not in runnable:
            runs.append(PhaseRun(phase.key, phase.title, "skipped: no CUDA"))
            continue
        later = runnable[runnable.index(phase) + 1 :]
        left = budget_s - (clock() - began)
        limit = allot(left, phase.cap_s, sum(p.floor_s for p in later), tail_s)
        if limit < phase.floor_s:
            runs.append(PhaseRun(phase.key, phase.title, f"skipped: no time left ({left:.0f} s of the budget)", limit_s=limit))
            continue
        print(f"\n== [{clock() - began:.0f} s] {phase.title} (at most {limit:.0f} s): {' '.join(phase.command)}", flush=True)
        returncode, wall, cut, samples = runner(phase.command, limit, results / f"{phase.key}.log", reader=reader)
        run = PhaseRun(phase.key, phase.title, status_of(returncode, cut, limit), returncode, wall, limit, gpu_util=samples)
        if phase.figure is not None:
            try:
                run.figure = phase.figure(results)
            except FileNotFoundError as exc:
                written = "before the cut" if cut else "by the command"
                run.figure = f"no {Path(exc.filename or '?').name} written {written}; what it printed is in {phase.key}.log"
            except Exception as exc:  # a figure that cannot be read is said, not fatal: the table must print
                run.figure = f"(no figure: {type(exc).__name__}: {exc})"
        runs.append(run)
    return runs


def format_table(runs: list[PhaseRun], machine: str, device: str, budget_s: float, elapsed_s: float) -> str:
    header = ("phase", "status", "wall s", "limit s", "GPU util", "result")
    rows = []
    for run in runs:
        util = f"{sum(run.gpu_util) / len(run.gpu_util):.0f}% mean, {max(run.gpu_util):.0f}% max" if run.gpu_util else "n/a"
        ran = run.limit_s > 0 and not run.status.startswith("skipped")
        rows.append((run.title, run.status, f"{run.wall_s:.0f}" if ran else "-", f"{run.limit_s:.0f}" if ran else "-", util, run.figure))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [
        f"fastpipe GPU check on {machine}",
        f"device {device}; budget {budget_s:.0f} s, table at {elapsed_s:.0f} s",
    ]
    for row in [header, tuple("-" * w for w in widths) + ("------",), *rows]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, [*widths, 0])).rstrip())
    failed = [r.title for r in runs if r.failed]
    cut = [r.title for r in runs if r.status.startswith("cut")]  # a cut phase kept what it printed (its log)
    skipped = [r.title for r in runs if r.status.startswith("skipped: no time")]
    lines.append(
        ("no phase failed" if not failed else f"FAILED: {', '.join(failed)}")
        + (f"; cut at their limit: {', '.join(cut)}" if cut else "")
        + (f"; no time left for: {', '.join(skipped)}" if skipped else "")
    )
    if not device.startswith("cuda"):
        lines.append(f"{device} is not a GPU: this is a dry run; the GPU figures await a GPU.")
    return "\n".join(lines)


# ----- each phase's headline figure, from the files it wrote -----------------------------------------------------
def tests_figure(path: Path) -> str:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    total, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    failed = [
        f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    text = f"{total - failures - errors - skipped} passed, {failures + errors} failed, {skipped} skipped"
    return text + (f" ({'; '.join(failed)})" if failed else "")


def compare_figure(path: Path) -> str:
    data = json.loads(path.read_text())
    variants = data.get("variants") or []
    cells = [
        f"{v['name']} {100 * v['fraction_of_bound']:.0f}%" for v in variants if gpu_table._number(v.get("fraction_of_bound")) is not None
    ]
    bound = gpu_table._number(data.get("device_bound_steps_per_s"))
    return " -> ".join(cells) + (f" of the bound ({bound:.2f} steps/s)" if bound else "")


def diagnosis_figure(path: Path) -> str:
    """Each measured point's share of the bound (a partial report has only some), the verdict and the stages named."""
    data = json.loads(path.read_text())
    points = [
        f"{e.get('cache_point') or 'baseline'} {100 * e['fraction_of_bound']:.0f}%"
        for e in data.get("experiments") or []
        if gpu_table._number(e.get("fraction_of_bound")) is not None
    ]
    named = ", ".join(b.get("stage", "?") for b in (data.get("bottlenecks") or [])[:3])
    partial = "partial report (interrupted): " if data.get("interrupted") else ""
    return f"{partial}{', '.join(points) or 'no point measured'} of the bound; {data.get('verdict')}" + (
        f"; names {named}" if named else ""
    )


def article_figure(path: Path) -> str:
    if not path.exists():  # cut short: the rows it printed as it measured them
        log = path.parent.parent / "article.log"
        rows = [line.strip() for line in log.read_text().splitlines() if line.endswith(" steps/s")] if log.exists() else []
        if not rows:
            raise FileNotFoundError(2, "no such file", str(path))
        return f"partial, {len(rows)} of 8 rows: " + "; ".join(rows)
    data = json.loads(path.read_text())
    rows = data.get("rows") or []
    cells = [f"{r['cache_point']} {100 * r['fraction_of_bound']:.0f}% (A10G {100 * r['article_fraction_of_bound']:.0f}%)" for r in rows[:5]]
    return f"{len(rows)} rows; toy:naive " + ", ".join(cells)


def loaders_figure(path: Path) -> str:
    data = json.loads(path.read_text())
    cells = [
        f"x{r['count']}: {r['thread']['images_per_s']:.0f} vs {r['dataloader']['images_per_s']:.0f} img/s "
        f"({r['thread']['images_per_s'] / r['dataloader']['images_per_s']:.2f}x)"
        for r in data["rows"]
    ]
    return "thread vs DataLoader " + "; ".join(cells)


def decode_figure(path: Path) -> str:
    data = json.loads(path.read_text())
    cells = [f"{name}: {row.get('skipped') or format(row['images_per_s'], '.0f') + ' img/s'}" for name, row in data["rows"].items()]
    ratio = data.get("gpu_over_cpu")
    return "; ".join(cells) + (f"; nvjpeg / CPU op {ratio:.2f}x" if ratio else "")


def collate_figure(path: Path) -> str:
    data = json.loads(path.read_text())
    side = data["training_side_s"]
    return f"collate {data['collate_speedup']:.1f}x, receive+pin {side['stock'] / max(side['recycled'], 1e-9):.1f}x cheaper recycled ({side['pinning']})"


def corpus_figure(path: Path) -> str:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _reads(name: str, read: Callable[[Path], str]) -> Callable[[Path], str]:
    return lambda results: read(results / name)


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test files with GPU tests (so pytest need not import the whole suite to find them)."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())


def build_phases(
    py: str, device: str, results: Path, steps: int, warmup: int, extra: list[str], extra_jpeg: list[str] | None = None
) -> list[Phase]:
    """The check's phases for ``device`` (cuda, or sim:... for a dry run), writing into ``results``."""
    r = str(results)
    fastpipe = [py, "-m", "fastpipe"]
    rungs = ["--steps", str(steps), "--warmup", str(warmup), "--budget", "5", "--no-progress"]
    return [
        Phase(
            "gpu_tests", "gpu tests", [py, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                                       "--junitxml", f"{r}/gpu_tests.xml", *gpu_test_files()],
            90, 40, needs_cuda=True, figure=_reads("gpu_tests.xml", tests_figure),
        ),
        Phase(
            "corpus", "photo corpus", [py, "-c", "from fastpipe.workloads.photos import build_corpus; "
                                       "p = build_corpus(n=2000, verbose=True); print(len(list(p.rglob('*.jpg'))), 'JPEGs in', p)"],
            60, 10, figure=_reads("corpus.log", corpus_figure),
        ),
        Phase(
            "compare_toy", f"compare toy ({device})",
            [*fastpipe, "compare", "toy", "--device", device, *rungs, "--json", f"{r}/compare_toy.json", "--markdown", f"{r}/compare_toy.md", *extra],
            90, 30, figure=_reads("compare_toy.json", compare_figure),
        ),
        Phase(
            "compare_jpeg", f"compare jpeg ({device})",
            [*fastpipe, "compare", "jpeg", "--device", device, *rungs, "--no-memory", "--json", f"{r}/compare_jpeg.json",
             "--markdown", f"{r}/compare_jpeg.md", *(extra_jpeg or [])],
            80, 30, figure=_reads("compare_jpeg.json", compare_figure),
        ),
        Phase(
            "script", "script mode (train_planted.py)",
            [*fastpipe, "diagnose", "--no-progress", "--no-memory", "--no-stage-costs", "--no-startup", "--steps", "4", "--warmup", "1",
             "--precision", "0.2", "--json", f"{r}/script.json", "--", py, "tests/scripts/train_planted.py",
             "--epochs", "20", "--samples", "2000", "-b", "16", "-j", "4", "--print-freq", "1000"],
            50, 25, figure=_reads("script.json", diagnosis_figure),
        ),
        Phase(
            "article", f"article table ({device})",
            [py, "benchmarks/reproduce_article.py", "--device", device, "--steps", str(steps), "--warmup", str(warmup), "--out", f"{r}/article"],
            70, 30, figure=_reads("article/article_reproduction.json", article_figure),
        ),
        Phase(
            "loaders", "thread loader vs DataLoader (4, 8, 16)",
            [py, "benchmarks/gpu_loaders.py", "--counts", "4,8,16", "--seconds", "2", "--json", f"{r}/loaders.json"],
            45, 20, figure=_reads("loaders.json", loaders_figure),
        ),
        Phase(
            "decode", "decode: nvjpeg vs CPU op",
            [py, "benchmarks/gpu_decode.py", "--seconds", "2", "--json", f"{r}/decode.json"],
            30, 10, figure=_reads("decode.json", decode_figure),
        ),
        Phase(
            "collate", "collate and pin (bench_collate)",
            [py, "benchmarks/bench_collate.py", "--batches", "6", "--json", f"{r}/collate.json"],
            30, 15, figure=_reads("collate.json", collate_figure),
        ),
        Phase(
            "demo", "make demo: diagnose toy:naive (defaults)",
            [*fastpipe, "diagnose", "toy:naive", *([] if device == "cuda" else ["--device", device]),
             "--json", f"{r}/demo.json", "--markdown", f"{r}/demo.md"],
            300, 60, figure=_reads("demo.json", diagnosis_figure),
        ),
    ]  # fmt: skip


MACHINE_PROBE = """
import json, os, platform, torch
from fastpipe._system import usable_cores
cuda = torch.cuda.is_available()
print(json.dumps({"gpu": torch.cuda.get_device_name(0) if cuda else None, "cuda": cuda, "cores": usable_cores(),
                  "torch": torch.__version__, "host": platform.node()}))
"""


def describe_machine(py: str) -> dict[str, Any]:
    """The machine's GPU, usable cores and torch, asked of a subprocess (a hung CUDA cannot hang the check)."""
    try:
        done = subprocess.run([py, "-c", MACHINE_PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
        return {"gpu": None, "cuda": False, "cores": os.cpu_count(), "torch": f"unknown ({exc})", "host": "unknown"}


def machine_words(machine: dict[str, Any]) -> str:
    return f"{machine.get('gpu') or 'no GPU'}, {machine.get('cores')} usable cores, torch {machine.get('torch')}"


def machine_slug(machine: dict[str, Any]) -> str:
    """A folder-name word for the machine: the GPU's model (``h200``), else ``nogpu-<cores>cores``."""
    gpu = machine.get("gpu")
    if not gpu:
        return f"nogpu-{machine.get('cores')}cores"
    words = [w for w in str(gpu).lower().replace("nvidia", "").replace("-", " ").split() if w not in ("geforce", "tesla")]
    return "-".join(words[:2]) or "gpu"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for every phase and the table")
    parser.add_argument("--results-root", type=Path, default=ROOT / "benchmarks" / "results", help="results go in gpu_check_<machine> here")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--extra", default="", help="more options for compare toy, e.g. smaller sizes on a dry run")
    parser.add_argument("--extra-jpeg", default="", help="more options for compare jpeg")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", default="", help="comma-separated phase keys to run (the others are left out)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    # every phase runs this checkout, installed or not (a benchmark run as a file has benchmarks/ on its path, not the root)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    machine = describe_machine(args.python)
    cuda = bool(machine.get("cuda")) and args.device.startswith("cuda")
    results = args.results_root / f"gpu_check_{machine_slug(machine)}{'' if cuda else '_dryrun'}"
    results.mkdir(parents=True, exist_ok=True)
    phases = build_phases(args.python, args.device, results, args.steps, args.warmup, args.extra.split(), args.extra_jpeg.split())
    if args.only:
        keep = set(args.only.split(","))
        phases = [p for p in phases if p.key in keep]
    reader = None
    if cuda:
        index = args.device.partition(":")[2]
        reader, _ = gpu_table.utilisation_reader(int(index) if index.isdigit() else 0)
    print(f"fastpipe GPU check on {machine_words(machine)}: device {args.device}, budget {args.budget:.0f} s, results in {results}")
    runs = run_phases(phases, args.budget - (time.perf_counter() - started), results, cuda=cuda, reader=reader)
    elapsed = time.perf_counter() - started
    table = format_table(runs, f"{machine_words(machine)} ({machine.get('host')})", args.device, args.budget, elapsed)
    print("\n" + table)
    (results / "gpu_check.txt").write_text(table + "\n")
    record = {"machine": machine, "device": args.device, "budget_s": args.budget, "elapsed_s": elapsed, "phases": [asdict(r) for r in runs]}
    (results / "gpu_check.json").write_text(json.dumps(record, indent=2))
    return 1 if any(r.failed for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
