"""``fastpipe watch -- python train.py ARGS``: is this script's accelerator waiting for data? No change to the script.

The script runs in this process (``runpy``, with its own ``sys.argv`` and its folder first on ``sys.path``, as
``python train.py`` would). For the duration, ``DataLoader.__iter__`` is tapped (:mod:`fastpipe.monitor`): every
DataLoader the script iterates gets a :class:`~fastpipe.monitor.Watch`, and, unless ``--no-stages``, its batches
come from a copy of it whose dataset and collate are timed inside the workers (the ledger of
:mod:`fastpipe.diagnosis.stagecost`; the timings travel with each batch and are stripped off before the script
sees it). The copy keeps every setting (workers, batch size, collate, pinning, persistent workers) and iterates
the script's own sampler (or batch sampler) and generator, not copies: ``sampler.set_epoch(epoch)``
(DistributedSampler) and a seeded generator give the batches, in the order, the script gets without fastpipe.
With ``--startup``, the training loader's first-batch wait is split once the script has ended (the diagnosis's
start-up pass, :mod:`fastpipe.diagnosis.unseen._startup`). With ``--check-streams``, each DataLoader over an ``IterableDataset`` is checked once, at its first ``iter()`` and
before its workers start, for workers (and DDP ranks) that deliver the same items or uneven shares
(:func:`fastpipe.diagnosis.unseen._streams.check_stream`, what ``fastpipe diagnose`` runs on a stream: a start of its
workers and 32 items from each, outside the watched loop's time). When the script ends, or on Ctrl-C, it prints the
input-bound share of the loader iterated most (the training loader), its stages, the stream checks, and the next step. The script's exit status, and the message of ``sys.exit("message")``,
come through as they would from ``python SCRIPT``.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader, IterableDataset

from fastpipe._command import parse_python_command
from fastpipe._render import render_table
from fastpipe.commands.common import check_output_paths
from fastpipe.errors import ConfigError
from fastpipe.monitor import HINT_SHARE, LoopSampler, Watch, band_for, no_loader_text, tap_dataloaders

EXIT_INTERRUPTED = 130


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="run a training script unchanged; report how much of its loop waits for data, and its stages",
        usage="fastpipe watch [--every N] [--no-stages] [--check-streams] [--startup] [--json PATH] -- python SCRIPT [ARGS ...]",
        description="Run SCRIPT as `python SCRIPT ARGS` would, in this process, timing every DataLoader it iterates. "
        "At exit or Ctrl-C, print the input-bound share of the loader iterated most, its stages timed "
        "inside the workers, and the next step.",
    )
    parser.add_argument("--every", type=int, default=None, metavar="N", help="also print a line every N steps of each loader")
    parser.add_argument(
        "--no-stages", action="store_true", help="do not time stages inside the workers (iterate the script's own loaders, untouched)"
    )
    parser.add_argument(
        "--check-streams",
        action="store_true",
        help="check each IterableDataset loader for workers (and ranks) that repeat each other's items or run out unevenly, "
        "once, at its first iter() (a start of its workers and 32 items from each)",
    )
    parser.add_argument(
        "--startup",
        action="store_true",
        help="after the script ends, split its training loader's first-batch wait (worker start, the dataset's transfer, "
        "worker_init_fn, first fetch) and measure each epoch's restart, with the fixes' savings: the diagnosis's start-up "
        "section (a few more starts of the loader's workers, after the script, outside the watched time)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the summary (and stages) as JSON here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="python SCRIPT [ARGS ...] (or -m MODULE [ARGS ...])")
    parser.set_defaults(handler=run)


def parse_command(command: list[str]) -> tuple[str, str, list[str]]:
    """``("path", script, args)`` or ``("module", name, args)`` from ``[--] [python] SCRIPT ARGS`` / ``-m MODULE``."""
    return parse_python_command(
        command,
        no_script="fastpipe watch needs a script to run: fastpipe watch -- python train.py ARGS",
        no_module="fastpipe watch -- python -m needs a module name",
        an_option="fastpipe watch runs a script, not python's option {option!r}: fastpipe watch -- python train.py ARGS",
    )


@dataclass
class _Watched:
    """One DataLoader the script iterated: its watch, its timed copy, and the stage times its batches brought."""

    loader: DataLoader
    label: str
    watch: Watch
    timed: DataLoader | None = None
    notes: list[str] = field(default_factory=list)
    framework: str | None = None
    samples: int = 0
    stages: dict[str, list[float]] = field(default_factory=dict)
    streams: Any = None
    """The stream check (a :class:`~fastpipe.diagnosis.unseen._streams.StreamCheck`), with ``--check-streams``."""

    def add(self, timings: Any) -> None:
        self.samples += timings.samples
        for name, (wall, cpu, *_) in timings.stages.items():  # a third figure (run-queue wait) may follow
            entry = self.stages.setdefault(name, [0.0, 0.0])
            entry[0] += wall
            entry[1] += cpu


class _Stripped(Iterator[Any]):
    """The timed copy's iterator as the script sees it: batches without their timings."""

    def __init__(self, source: Iterator[Any], into: _Watched) -> None:
        self._source, self._into = source, into

    def __iter__(self) -> "_Stripped":
        return self

    def __next__(self) -> Any:
        batch, timings = next(self._source)
        self._into.add(timings)
        return batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_source", "_into"):
            raise AttributeError(name)
        return getattr(self._source, name)


class Session:
    """The loaders seen while the script runs (kept alive by reference, so ids are not reused)."""

    def __init__(self, *, every: int | None, stages: bool, echo: Callable[[str], None], check_streams: bool = False) -> None:
        self.every, self.stages, self.echo, self.check_streams = every, stages, echo, check_streams
        self.watched: dict[int, _Watched] = {}
        self.sampler: LoopSampler | None = None
        """Where the script's main thread is, until it iterates a DataLoader (what its loop reads when it iterates none)."""
        self._checking = False

    def select(self, loader: DataLoader) -> Watch | None:
        if self._checking:
            return None  # the stream check's own loader is not the script's
        entry = self.watched.get(id(loader))
        if self.sampler is not None:
            self.sampler.stop()
        if entry is None:
            label = f"DataLoader #{len(self.watched) + 1}"
            echo = lambda line, label=label: self.echo(line.replace("fastpipe.watch:", f"fastpipe.watch [{label}]:", 1))  # noqa: E731
            entry = _Watched(
                loader, label, Watch(loader, every=self.every, echo=echo, memory=False, hint=False), framework=_calling_framework()
            )
            self.watched[id(loader)] = entry
            if self.check_streams and isinstance(loader.dataset, IterableDataset):
                self._check_stream(entry)
        return entry.watch

    def _check_stream(self, entry: _Watched) -> None:
        """The stream check, once per loader, before its first epoch (every DDP rank reaches it at the same ``iter()``)."""
        from fastpipe.diagnosis import check_stream

        self._checking = True
        try:
            entry.streams = check_stream(entry.loader)
        except Exception as exc:  # the user's stream failing in a pass of its own: the script runs on
            entry.notes.append(f"the stream check could not run ({type(exc).__name__}: {exc})")
        finally:
            self._checking = False
        if entry.streams is None and not any("stream check" in n for n in entry.notes):
            entry.notes.append("the stream check found one source only (num_workers=0 outside DDP): nothing to compare")

    def source(self, loader: DataLoader, original: Callable[[DataLoader], Iterator[Any]]) -> Iterator[Any]:
        entry = self.watched[id(loader)]
        if not self.stages:
            return original(loader)
        if entry.timed is None:
            from fastpipe.diagnosis.stagecost import timed_loader

            try:
                entry.timed, entry.notes = timed_loader(loader, share_sampler=True)
            except Exception as exc:  # a loader that cannot be rebuilt (an unusual subclass): watch it untimed
                self.stages_off(entry, f"its stages could not be timed ({type(exc).__name__}: {exc}); it ran untouched")
                return original(loader)
        return _Stripped(original(entry.timed), entry)

    def stages_off(self, entry: _Watched, why: str) -> None:
        entry.notes.append(why)
        entry.timed = None

    def main(self) -> _Watched | None:
        """The loader iterated most: the training loader in any ordinary script."""
        now = time.perf_counter()
        if not self.watched:
            return None
        return max(self.watched.values(), key=lambda e: e.watch.ledger.current(now).steps)


def _calling_framework() -> str | None:
    """``"lightning"`` or ``"transformers"`` when one of them is iterating the loader (read once, at ``iter()``)."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        for framework in ("lightning", "pytorch_lightning", "transformers", "accelerate"):
            if module == framework or module.startswith(framework + "."):
                return "lightning" if "lightning" in framework else "transformers"
        frame = frame.f_back
    return None


def exit_status(code: Any) -> int:
    """The status ``python SCRIPT`` exits with for ``sys.exit(code)``; a message (any non-int) is printed to stderr, as
    Python prints it, and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stdout.flush()
    print(code, file=sys.stderr, flush=True)
    return 1


def run(args: argparse.Namespace) -> int:
    kind, target, script_args = parse_command(args.command)
    if args.every is not None and args.every < 1:
        raise ConfigError(f"--every must be a positive number of steps. Got {args.every}.")
    check_output_paths(args)  # before the script runs: a bad --json is one line now, not a traceback at the end

    def echo(line: str) -> None:  # stderr: stdout stays the script's; flushed first so the two interleave in order
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)

    session = Session(every=args.every, stages=not args.no_stages, echo=echo, check_streams=args.check_streams)
    code, interrupted = 0, False
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [target, *script_args]
    sys.path.insert(0, str(Path(target).resolve().parent) if kind == "path" else os.getcwd())
    session.sampler = LoopSampler(target)
    try:
        with session.sampler, tap_dataloaders(session.select, session.source):
            if kind == "path":
                runpy.run_path(target, run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except KeyboardInterrupt:
        interrupted, code = True, EXIT_INTERRUPTED
    except SystemExit as exc:
        code = exit_status(exc.code)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    for entry in session.watched.values():
        entry.watch.close()
    main = session.main()
    echo(report(session, main, target, interrupted, command=_command_line(kind, target, script_args)))
    startup = _startup(main, echo) if args.startup and not interrupted else None
    if args.json is not None and main is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = summary(main)
        if startup is not None:
            out["startup"] = startup.to_dict()
        args.json.write_text(json.dumps(out, indent=2))
    return code


def _startup(main: _Watched | None, echo: Callable[[str], None]) -> Any:
    """``--startup``: the diagnosis's start-up pass on the training loader, once the script has ended (its workers,
    started anew on a rebuilt loader with every setting kept, are no part of the watched time); its lines echoed."""
    from fastpipe.diagnosis.unseen._startup import measure_startup

    if main is None:
        return None
    if main.loader.num_workers == 0:
        echo("Start-up: not measured (num_workers=0: the first batch is the first fetch, with no workers to start)")
        return None
    try:
        startup = measure_startup(main.loader)
    except Exception as exc:  # noqa: BLE001 - the watch's own report stands; say why the pass could not run
        echo(f"Start-up: not measured ({type(exc).__name__}: {exc})")
        return None
    if startup is not None:
        echo("\n".join(startup.lines()))
    return startup


def summary(entry: _Watched) -> dict[str, Any]:
    out = entry.watch.summary()
    out["loader"] = entry.label
    out["stages"] = (
        {
            name: {"ms_per_sample": 1000 * wall / entry.samples, "cpu_ms_per_sample": 1000 * cpu / entry.samples}
            for name, (wall, cpu) in entry.stages.items()
        }
        if entry.samples
        else {}
    )
    out["stage_notes"] = list(entry.notes)
    if entry.streams is not None:
        out["streams"] = entry.streams.to_dict()
    return out


def _command_line(kind: str, target: str, args: list[str]) -> str:
    """``python SCRIPT ARGS`` as the user ran it, quoted for a shell."""
    import shlex

    return shlex.join(["python", *(["-m"] if kind == "module" else []), target, *args])


def report(session: Session, main: _Watched | None, script: str, interrupted: bool, command: str | None = None) -> str:
    """The closing text: the share, the stage table, the next step (``command``: how the script was run)."""
    ended = "interrupted (Ctrl-C)" if interrupted else "ended"
    if main is None:
        found = no_loader_text(session.sampler.loop_calls() if session.sampler is not None else [])
        if found:
            return f"fastpipe watch: {script} {ended} without iterating a DataLoader;\n{found}\n"
        return f"fastpipe watch: {script} {ended} without iterating a DataLoader: nothing to report"
    info = main.watch.summary()
    share = info["input_bound_share"]
    others = [e.label for e in session.watched.values() if e is not main]
    loader = main.loader
    lines = [
        f"fastpipe watch: {script} {ended}. Its training loader ({main.label}: batch_size={loader.batch_size}, "
        f"num_workers={loader.num_workers}, the one iterated most" + (f"; also seen: {', '.join(others)}" if others else "") + ")",
        f"  waited for batches {share:.1%} of the loop's time: {band_for(share)} "
        f"({info['steps']} steps in {info['epochs']} epoch(s), {info['wait_ms_per_step']:.1f} ms wait and "
        f"{info['ms_per_step']:.1f} ms in all per step; first batch, worker start-up included, {1000 * info['first_batch_s']:.0f} ms)",
    ]
    text = "\n".join(lines) + "\n"
    if main.samples:
        total = sum(wall for wall, _ in main.stages.values()) or 1.0
        rows = [
            (name, f"{1000 * wall / main.samples:.2f}", f"{wall / total:.1%}", f"{1000 * cpu / main.samples:.2f}")
            for name, (wall, cpu) in main.stages.items()
        ]
        text += render_table(
            f"stages inside the workers ({main.samples} samples timed)",
            [("stage", "left"), ("ms/sample", "right"), ("of worker time", "right"), ("CPU ms/sample", "right")],
            rows,
            lines=[f"note: {n}" for n in main.notes],
        )
    elif main.notes:
        text += "".join(f"  note: {n}\n" for n in main.notes)
    for entry in session.watched.values():
        if entry.streams is not None:
            text += f"{entry.label}: " + "\n".join(entry.streams.lines()) + "\n"
    text += next_step(share, script, loader, main.framework, command)
    return text


def next_step(share: float, script: str, loader: DataLoader, framework: str | None, command: str | None = None) -> str:
    """What to run next: nothing, or the integration, or the factory that gives the full ladder."""
    if share < HINT_SHARE:
        return (
            f"next step: none needed for the input pipeline (under {HINT_SHARE:.0%} of the time waiting); "
            "the step itself is where time goes\n"
        )
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if framework == "lightning":
        where = "it trains with Lightning: run the ladder on its module and datamodule"
        how = f'    report = fastpipe.integrations.lightning.diagnose(module, datamodule, device="{device}"); print(report)\n'
    elif framework == "transformers":
        where = "it trains with the Hugging Face Trainer: run the ladder on the trainer"
        how = f'    report = fastpipe.integrations.hf.diagnose(trainer, device="{device}"); print(report)\n'
    else:
        stem = Path(script).stem
        where = (
            "run it inside the script's own loop, unchanged (a dry run: the script stops after the report):\n"
            f"    fastpipe diagnose -- {command or f'python {script} ARGS'}\n"
            "  or write a factory for the full ladder with a step of your own"
        )
        how = (
            f"    # fastpipe_workload.py, next to {script}: build what {stem} builds, return the loader and one step\n"
            f"    def make_workload(device):\n"
            f"        loader = ...            # the DataLoader above (batch_size={loader.batch_size}, num_workers={loader.num_workers})\n"
            f"        model = ...to(device); optimizer = ...\n"
            f"        def step(batch):        # one training step on a batch already on the device\n"
            f"            ...\n"
            f"        return fastpipe.Workload(loader=loader, step=step, model=model, optimizer=optimizer)\n"
            f"  then: fastpipe diagnose fastpipe_workload:make_workload --device {device}\n"
        )
    return f"next step: the cache ladder names the slow stage and what it costs per step; {where}:\n{how}"
