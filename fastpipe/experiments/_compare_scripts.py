"""A script against a script: ``fastpipe compare -- python train.py ARGS -- python train_patched.py ARGS``.

Why: ``fastpipe fix`` measures a fix inside the original script's loop; once the patch is applied, the patched script
is what trains, and its gain must hold there (a gain measured once at +300% read +102% and "none" when re-measured by
hand under load). So each script runs in its own loop, unchanged, and only its steps are timed:

* each run is a child process (``python -m fastpipe.experiments._compare_scripts --child ...``) that runs the script as
  ``python`` would (``runpy``), with its loaders tapped (a :mod:`fastpipe.monitor` tap for DataLoaders, and
  fastpipe's ThreadLoader, which a patch may put in): a step is the time between two batches of the training loader
  (the first loader to deliver ``warmup + steps`` batches), the loop's work and its wait for data together, as
  ``fastpipe watch`` times it; the first batch of each epoch is not a step (it waits for workers to start). After
  ``warmup`` untimed steps and ``steps`` timed ones, the child stops the script and writes its step times;
* the two scripts alternate in rounds, the order rotated (A B, B A, A B, ...), so a change in the machine's load
  falls on both;
* the gain is the geometric mean over the rounds of ``A's ms/step / B's``, minus 1 (paired by round: a load that
  changes between rounds falls on both sides of a ratio), and its noise two standard errors of the per-round log
  ratios (:data:`fastpipe.diagnosis.ladder._noise.SIGNIFICANCE`); with ``--expected`` (what ``fix`` measured), the report
  says how much of it held.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from fastpipe._command import parse_python_command
from fastpipe.diagnosis.ladder._noise import SIGNIFICANCE
from fastpipe.errors import ConfigError

HELD = 0.25
"""A measured gain within this share of the expected one "holds" (the issue's bar: within 25%)."""
CHILD_TIMEOUT_S = 900.0


# --- the child: one script, its loop timed ----------------------------------------------------------------------


class _Done(BaseException):
    """Raised from the training loader's ``next()`` once its steps are timed: the script stops there."""


class _Timer:
    """Times the steps of the first loader to deliver ``warmup + steps`` batches."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self.seen: dict[int, dict[str, Any]] = {}

    def wrap(self, loader: Any, batches: Iterator[Any]) -> Iterator[Any]:
        entry = self.seen.setdefault(id(loader), {"loader": loader, "intervals": [], "batches": 0, "epochs": 0, "label": _label(loader)})
        entry["epochs"] += 1
        last = None
        for batch in batches:
            now = time.perf_counter()
            if last is not None:
                entry["intervals"].append(now - last)
            entry["batches"] += 1
            if len(entry["intervals"]) >= self.warmup + self.steps:
                self.done = entry
                raise _Done
            yield batch
            last = now

    def result(self) -> dict[str, Any]:
        entry = getattr(self, "done", None)
        if entry is None:  # the script ended first: the loader that gave the most steps
            entries = sorted(self.seen.values(), key=lambda e: len(e["intervals"]))
            entry = entries[-1] if entries else None
        if entry is None:
            return {"loader": None, "step_s": [], "complete": False}
        return {
            "loader": entry["label"],
            "step_s": entry["intervals"][self.warmup :],
            "complete": getattr(self, "done", None) is entry,
            "epochs": entry["epochs"],
        }


def _label(loader: Any) -> str:
    workers = getattr(loader, "num_workers", None)
    threads = getattr(loader, "threads", None)
    how = f"threads={threads}" if threads is not None else f"num_workers={workers}"
    return f"{type(loader).__name__}(batch_size={getattr(loader, 'batch_size', None)}, {how})"


def _internal(frame: Any) -> bool:
    """Whether ``iter()`` was called by fastpipe's own loaders (the ThreadLoader's index loader), not the script."""
    marker = os.sep + os.path.join("fastpipe", "datasets") + os.sep
    while frame is not None:
        if marker in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def run_child(kind: str, target: str, args: list[str], warmup: int, steps: int) -> dict[str, Any]:
    """Run the script in this process until its training loader has given ``warmup + steps`` steps; their times."""
    from torch.utils.data import DataLoader

    from fastpipe.datasets import ThreadLoader
    from fastpipe.monitor import Watch, tap_dataloaders

    timer = _Timer(warmup, steps)

    def select(loader: DataLoader) -> Any:
        return None if _internal(sys._getframe(1)) else Watch(loader, echo=False, memory=False, hint=False)

    def source(loader: DataLoader, original: Callable[[DataLoader], Iterator[Any]]) -> Iterator[Any]:
        return timer.wrap(loader, original(loader))

    thread_iter = ThreadLoader.__iter__

    def threaded(loader: ThreadLoader) -> Any:
        return timer.wrap(loader, thread_iter(loader))

    sys.argv = [target, *args]
    sys.path.insert(0, str(Path(target).resolve().parent) if kind == "path" else os.getcwd())
    ThreadLoader.__iter__ = threaded  # type: ignore[method-assign]
    error = None
    try:
        with tap_dataloaders(select, source):
            if kind == "path":
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except _Done:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            error = f"the script exited with {exc.code!r}"
    except Exception as exc:  # noqa: BLE001 - the parent reports the script's error
        error = f"the script raised {type(exc).__name__}: {exc}"
    finally:
        ThreadLoader.__iter__ = thread_iter  # type: ignore[method-assign]
    out = timer.result()
    out["error"] = error
    return out


def _child_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastpipe.experiments._compare_scripts")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(list(argv))
    kind, target, args = parse_script(options.command)
    result = run_child(kind, target, args, options.warmup, options.steps)
    sys.stdout.flush()
    options.out.write_text(json.dumps(result))
    os._exit(0)  # the script's threads and workers: what they do after its steps is not ours to wait for


# --- the parent: rounds, and the comparison ---------------------------------------------------------------------


def parse_script(command: Sequence[str]) -> tuple[str, str, list[str]]:
    """``("path", script, args)`` or ``("module", name, args)`` from ``[--] [python] SCRIPT ARGS`` / ``-m MODULE``."""
    return parse_python_command(
        command,
        no_script="fastpipe compare needs two scripts: fastpipe compare -- python train.py ARGS -- python train_patched.py ARGS",
        no_module="`python -m` needs a module name",
    )


def split_commands(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """The two commands of ``[--] python a.py ARGS -- python b.py ARGS`` (the first ``--`` may be gone already)."""
    words = list(words)
    if words and words[0] == "--":
        words.pop(0)
    if words.count("--") != 1:
        raise ConfigError(
            "compare two scripts as: fastpipe compare [OPTIONS] -- python train.py ARGS -- python train_patched.py ARGS "
            f"(one `--` between the two commands; got {words.count('--')})"
        )
    cut = words.index("--")
    return words[:cut], words[cut + 1 :]


def is_scripts(specs: Sequence[str]) -> bool:
    """Whether compare's positional words name scripts (``python x.py``, ``x.py``, a ``--`` between two commands)."""
    first = specs[0] if specs else ""
    return "--" in specs or first.endswith(".py") or Path(first).name.startswith("python") or first == sys.executable


@dataclass
class Run:
    """One run of one script: its training loader and the times of its timed steps (seconds)."""

    script: str
    loader: str | None
    step_s: list[float]
    complete: bool
    error: str | None = None

    @property
    def ms(self) -> float:
        return 1000 * statistics.fmean(self.step_s) if self.step_s else math.nan


@dataclass
class ScriptComparison:
    """Two scripts measured in their own loops, in rotated rounds.

    Attributes:
        a, b: the two command lines (A: the original, B: the patched script).
        rounds: each round's runs, ``(a_run, b_run)``, in the order measured.
        expected: the gain ``fix`` measured for the patch (0.5 = +50%), or None.
        load: the machine's 1-minute load average before and after.
    """

    a: list[str]
    b: list[str]
    rounds: list[tuple[Run, Run]] = field(default_factory=list)
    expected: float | None = None
    load: tuple[float, float] | None = None

    def _ms(self, which: int) -> tuple[float, float]:
        """Mean ms/step over the rounds, and its relative standard error (from the per-round means)."""
        means = [pair[which].ms for pair in self.rounds if pair[which].step_s]
        if not means:
            return math.nan, math.nan
        mean = statistics.fmean(means)
        spread = statistics.stdev(means) / math.sqrt(len(means)) / mean if len(means) > 1 else math.nan
        return mean, spread

    def _log_ratios(self) -> list[float]:
        """Each round's log(A's ms/step / B's): the two were measured side by side, under the same load."""
        return [math.log(pair[0].ms / pair[1].ms) for pair in self.rounds if pair[0].step_s and pair[1].step_s]

    @property
    def gain(self) -> float:
        """How much faster B's steps are than A's: the geometric mean over the rounds of A's ms/step / B's, minus 1
        (+1.0: B takes half the time a step). Paired by round, so a load that changes between rounds cancels."""
        logs = self._log_ratios()
        return math.exp(statistics.fmean(logs)) - 1 if logs else math.nan

    @property
    def noise(self) -> float:
        """Two standard errors of the gain (:data:`SIGNIFICANCE`), from the spread of the per-round log ratios."""
        logs = self._log_ratios()
        if len(logs) < 2:
            return math.nan
        return (1 + self.gain) * SIGNIFICANCE * statistics.stdev(logs) / math.sqrt(len(logs))

    @property
    def held(self) -> float | None:
        """The measured gain as a share of the expected one (1.0: all of it); None without an expectation."""
        if self.expected is None or self.expected == 0:
            return None
        return self.gain / self.expected

    def verdict(self) -> str:
        """Whether the expected gain held: within :data:`HELD` of it, with noise narrower than that band; it does not
        hold when the gap is beyond the band by more than the noise; otherwise not shown either way."""
        if self.expected is None:
            return "no expected gain given"
        gap, band, noise = self.gain - self.expected, HELD * abs(self.expected), self.noise
        if noise != noise:  # one round: no spread to judge by
            return f"not shown either way: {gap:+.0%} from the expected gain, and one round gives no noise; run more --rounds"
        if abs(gap) <= band and noise <= band:
            return f"it holds (within {HELD:.0%} of the expected gain, noise ±{noise:.0%})"
        if abs(gap) - noise > band:
            return f"it does not hold ({gap:+.0%} from the expected gain, beyond {HELD:.0%} of it by more than the noise, ±{noise:.0%})"
        if abs(gap) <= band:
            why = f"but this run's noise (±{noise:.0%}) is wider than {HELD:.0%} of it (±{band:.0%})"
        else:
            why = f"beyond {HELD:.0%} of it (±{band:.0%}) by less than this run's noise (±{noise:.0%})"
        return f"not shown either way: {gap:+.0%} from the expected gain, {why}; more --rounds or a quieter machine narrow it"

    def lines(self) -> list[str]:
        a_ms, a_err = self._ms(0)
        b_ms, b_err = self._ms(1)
        loaders = {pair[i].loader for pair in self.rounds for i in (0, 1)}
        steps = sum(len(pair[0].step_s) for pair in self.rounds), sum(len(pair[1].step_s) for pair in self.rounds)
        out = [
            f"fastpipe compare: two scripts, each in its own loop, {len(self.rounds)} rounds in rotated order",
            f"  A {shlex.join(self.a)}",
            f"    {a_ms:.1f} ms/step ± {200 * a_err:.1f}% ({steps[0]} timed steps; {_loaders(self.rounds, 0)})",
            f"  B {shlex.join(self.b)}",
            f"    {b_ms:.1f} ms/step ± {200 * b_err:.1f}% ({steps[1]} timed steps; {_loaders(self.rounds, 1)})",
        ]
        gain, noise = self.gain, self.noise
        significant = noise == noise and abs(gain) > noise
        verdict = "beyond noise" if significant else "within noise" if noise == noise else "noise unknown (one round)"
        out.append(f"  gain of B over A: {gain:+.0%} ± {noise:.0%} ({verdict}; per-round gains: {self._round_gains()})")
        if self.expected is not None:
            out.append(
                f"  expected (what fix measured): {self.expected:+.0%}; measured here: {gain:+.0%}, {self.held:.0%} of it: {self.verdict()}"
            )
        problems = [f"{'AB'[i]}: {pair[i].error}" for pair in self.rounds for i in (0, 1) if pair[i].error]
        short = [f"{'AB'[i]}" for pair in self.rounds for i in (0, 1) if not pair[i].complete and not pair[i].error]
        out += [f"  note: {p}" for p in dict.fromkeys(problems)]
        if short:
            out.append(f"  note: {len(short)} run(s) ended before all their steps ({', '.join(short)}): fewer steps timed")
        if len(loaders) > 2:
            out.append(f"  note: the training loader differed between runs: {', '.join(sorted(str(x) for x in loaders))}")
        if self.load is not None:
            out.append(f"  load average (1 min): {self.load[0]:.1f} before, {self.load[1]:.1f} after")
        return out

    def _round_gains(self) -> str:
        return ", ".join(f"{math.exp(g) - 1:+.0%}" for g in self._log_ratios()) or "none"

    def __str__(self) -> str:
        return "\n".join(self.lines()) + "\n"

    def to_dict(self) -> dict[str, Any]:
        a_ms, a_err = self._ms(0)
        b_ms, b_err = self._ms(1)
        return {
            "a": self.a,
            "b": self.b,
            "a_ms_per_step": a_ms,
            "b_ms_per_step": b_ms,
            "a_rel_stderr": a_err,
            "b_rel_stderr": b_err,
            "gain": self.gain,
            "noise": self.noise,
            "expected": self.expected,
            "held": self.held,
            "verdict": self.verdict(),
            "load": self.load,
            "rounds": [[asdict(run) for run in pair] for pair in self.rounds],
        }


def _loaders(rounds: list[tuple[Run, Run]], which: int) -> str:
    names = sorted({str(pair[which].loader) for pair in rounds})
    return ", ".join(names)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


def run_once(command: Sequence[str], warmup: int, steps: int, timeout_s: float = CHILD_TIMEOUT_S) -> Run:
    """One child run of ``command`` (``python script.py ARGS``): its timed steps."""
    kind, target, _ = parse_script(command)
    with tempfile.TemporaryDirectory(prefix="fastpipe-compare-") as folder:
        out = Path(folder) / "run.json"
        child = [sys.executable, "-m", "fastpipe.experiments._compare_scripts", "--child", "--warmup", str(warmup)]
        child += ["--steps", str(steps), "--out", str(out), "--", *command]
        try:
            done = subprocess.run(child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Run(target, None, [], False, f"no result in {timeout_s:.0f} s")
        if not out.exists():
            tail = (done.stderr or "").strip().splitlines()[-3:]
            return Run(target, None, [], False, f"exit {done.returncode}: {' / '.join(tail)}")
        result = json.loads(out.read_text())
    return Run(target, result["loader"], list(result["step_s"]), bool(result["complete"]), result.get("error"))


def compare_scripts(
    a: Sequence[str],
    b: Sequence[str],
    *,
    rounds: int = 4,
    warmup: int = 3,
    steps: int = 10,
    expected: float | None = None,
    echo: Callable[[str], None] | None = None,
    runner: Callable[[Sequence[str], int, int], Run] | None = None,
) -> ScriptComparison:
    """Measure script ``b`` against script ``a``, each in its own loop, in ``rounds`` rotated rounds.

    Args:
        a, b: the command lines (``["python", "train.py", ...]``), run from the current folder.
        rounds: rounds of one run each (A B, then B A, ...); at least 2 for the noise.
        warmup, steps: untimed and timed steps of each run.
        expected: what ``fix`` measured for B (0.5 = +50%), to say how much of it held.
        echo: a line per run, as it ends (progress).
        runner: ``runner(command, warmup, steps) -> Run`` (default :func:`run_once`, a child process per run).
    """
    runner = run_once if runner is None else runner
    if rounds < 1 or steps < 2 or warmup < 0:
        raise ConfigError("compare of two scripts needs --rounds >= 1, --steps >= 2 and --warmup >= 0")
    parse_script(a), parse_script(b)  # a missing script is one line now, not a child's traceback
    comparison = ScriptComparison(list(a), list(b), expected=expected)
    before = _load()
    for index in range(rounds):
        order = (0, 1) if index % 2 == 0 else (1, 0)
        runs: list[Run | None] = [None, None]
        for which in order:
            run = runner((a, b)[which], warmup, steps)
            runs[which] = run
            if echo is not None:
                state = f"{run.ms:.1f} ms/step over {len(run.step_s)} steps" if run.step_s else f"no steps ({run.error})"
                echo(f"fastpipe compare: round {index + 1}/{rounds}, {'AB'[which]}: {state}")
        comparison.rounds.append((runs[0], runs[1]))  # type: ignore[arg-type]
    comparison.load = (before, _load())
    return comparison


def parse_gain(text: str) -> float:
    """``"300%"``, ``"+300%"`` or ``"3.0"`` (a fraction) as a gain: 3.0."""
    value = text.strip()
    try:
        return float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise ConfigError(f"--expected takes a gain as a percentage (+300%) or a fraction (3.0). Got {text!r}.") from None


def run_cli(args: argparse.Namespace) -> int:
    """``fastpipe compare [OPTIONS] -- python a.py ARGS -- python b.py ARGS`` (the compare command's script branch)."""
    a, b = split_commands(args.specs)
    if getattr(args, "markdown", None) is not None or getattr(args, "plot", None) is not None:
        raise ConfigError("--markdown and --plot apply to SPEC comparisons; two scripts write --json")
    if getattr(args, "device", None) is not None:
        raise ConfigError("--device applies to SPECs: each script runs on the device its own arguments give (e.g. --device cuda)")
    expected = parse_gain(args.expected) if getattr(args, "expected", None) is not None else None

    def echo(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    comparison = compare_scripts(
        a, b, rounds=getattr(args, "rounds", 4), warmup=args.warmup, steps=args.steps, expected=expected, echo=echo
    )
    print(comparison, end="")
    if getattr(args, "json", None) is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(comparison.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
