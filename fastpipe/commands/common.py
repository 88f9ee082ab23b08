"""Arguments shared by the subcommands that run a workload."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from fastpipe.errors import ConfigError, OptionalDependencyError

TOY_OPTION_NAMES = ("num_workers", "batch_size", "raw_size", "img_size", "model")


def add_toy_options(parser: argparse.ArgumentParser) -> None:
    """The toy workload's size options (the article's values by default)."""
    toy = parser.add_argument_group("built-in workload options (SPEC toy:*, jpeg:*)")
    toy.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default: the article's 4, capped at usable cores)")
    toy.add_argument("--batch-size", type=int, default=None, help="batch size (default 256)")
    toy.add_argument("--raw-size", type=int, default=None, help="side of the raw square image (default 1024)")
    toy.add_argument("--img-size", type=int, default=None, help="crop size (default 256)")
    toy.add_argument("--model", default=None, help="torchvision model name for cpu/cuda (default resnet50)")


DEVICE_HELP = (
    "cuda[:N], cpu, or sim:STEP_MS[,h2d_gbps=G] (default: cuda if present, else the SPEC's own simulated step). "
    "sim:290 is the article's step (resnet50, batch 256, an A10G) and the default for toy and your own SPECs: "
    "for your own model, size STEP_MS from your GPU, the time of one training step with data already on "
    "it (the device bound that `fastpipe diagnose SPEC --device cuda` reports first), or sim:100 to ask whether the pipeline "
    "would keep up with a GPU that does a step in 100 ms). Your factory's `device` argument is the matching "
    "torch.device (cpu on sim); ask for `fastpipe_device` to get fastpipe's Device"
)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help=DEVICE_HELP)


def resolve_device(device: str | None, specs: "str | list[str]") -> Any:
    """The Device to run ``specs`` on: the one asked for, or the default for those SPECs (see default_device_for)."""
    from fastpipe.devices import parse_device
    from fastpipe.workloads._workload import default_device_for

    return parse_device(default_device_for(specs) if device is None else device)


def add_workload_arguments(parser: argparse.ArgumentParser, *, spec_optional: bool = False) -> None:
    """SPEC, --device and the toy workload's size options, shared by every subcommand that runs one
    (``spec_optional``: ``fastpipe diagnose -- python SCRIPT`` takes a script instead)."""
    parser.add_argument(
        "spec",
        metavar="SPEC",
        nargs="?" if spec_optional else None,
        help="toy:naive, toy:optimized, jpeg:VARIANT, or package.module:function "
        "(looked up in the current directory first, as python -m does) returning (loader, step), a fastpipe.Workload, "
        "or (LightningModule, datamodule)",
    )
    add_device_argument(parser)
    add_toy_options(parser)


def toy_option_values(args: argparse.Namespace, is_toy: bool) -> dict[str, Any]:
    """The toy options given on the command line, checked; an error if given for a non-toy SPEC."""
    options = {name: getattr(args, name) for name in TOY_OPTION_NAMES if getattr(args, name) is not None}
    if options and not is_toy:
        flags = ", ".join("--" + name.replace("_", "-") for name in options)
        raise ConfigError(f"{flags} only apply to the built-in toy:* and jpeg:* workloads; size your own workload in its factory")
    for name, value in options.items():
        if name != "model" and (value < 0 or (value == 0 and name != "num_workers")):
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return options


def _default(name: str) -> Any:
    """A knob's default, read from the options class itself: the command line and Python share one set of defaults."""
    from fastpipe.diagnosis._options import DiagnoseOptions

    return next(f.default for f in dataclasses.fields(DiagnoseOptions) if f.name == name)


def add_step_arguments(parser: argparse.ArgumentParser, per: str) -> None:
    """--steps and --warmup, measured per experiment, variant or setting (``per``): the whole of the measuring flags of
    the commands that only count steps (``run``, ``costs``)."""
    parser.add_argument("--steps", type=int, default=_default("steps"), help=f"measured steps per {per} (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=_default("warmup"), help=f"untimed warm-up steps per {per} (default %(default)s)")


def add_measure_flags(parser: argparse.ArgumentParser, per: str, *, budget_help: str = "") -> None:
    """The flags of :class:`~fastpipe.MeasureOptions` (--steps, --warmup, --budget, --precision), for every command that
    measures (diagnose and script mode, compare, tune, fix); :func:`measure_options_from` reads them back."""
    add_step_arguments(parser, per)
    parser.add_argument(
        "--budget",
        type=float,
        default=_default("budget"),
        help=f"seconds of measuring per {per} before it stops short of the precision target (default %(default)s{budget_help})",
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=_default("precision"),
        help=f"target relative standard error of each {per}'s mean step time (default %(default)s)",
    )


def add_diagnose_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`~fastpipe.DiagnoseOptions` beyond the measuring ones (``fastpipe diagnose``, a SPEC or a
    script); :func:`diagnose_options_from` reads them back."""
    from fastpipe.diagnosis._options import STRATEGIES

    parser.add_argument(
        "--pool",
        type=int,
        default=_default("pool"),
        help="different samples/batches each cache point cycles through (default: 1, or 8 when the first samples differ in size)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=_default("threshold"),
        help="smallest added time per step that counts, as a fraction of the device step (default %(default)s)",
    )
    parser.add_argument(
        "--strategy", choices=STRATEGIES, default=_default("strategy"), help="measure every point, or bisect over the stages"
    )
    parser.add_argument(
        "--no-stage-costs", action="store_true", help="skip the extra pass that times each stage when a drop appears at a saturated CPU"
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the short pass after the ladder that reads the loader for worker memory growth and the shared-memory peak "
        "(each cache point's memory at its end is read either way)",
    )
    parser.add_argument(
        "--no-startup",
        action="store_true",
        help="skip the pass that starts the loader twice more to split the wait for its first batch (worker start, "
        "dataset transfer, worker_init_fn, first fetch) and project each fix's saving",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def measure_options_from(args: argparse.Namespace) -> Any:
    """The :class:`~fastpipe.MeasureOptions` the command line asks for (checked here, before any work)."""
    from fastpipe.diagnosis._options import MeasureOptions

    return MeasureOptions(steps=args.steps, warmup=args.warmup, budget=args.budget, precision=args.precision)


def diagnose_options_from(args: argparse.Namespace) -> Any:
    """The :class:`~fastpipe.DiagnoseOptions` ``fastpipe diagnose``'s flags ask for (checked here, before any work);
    the progress bar only on a terminal. A command that measures without :func:`add_diagnose_flags` (``fastpipe fix --
    python train.py`` runs script mode too) gets their defaults."""
    from fastpipe.diagnosis._options import DiagnoseOptions

    def off(flag: str) -> bool:
        return bool(getattr(args, flag, False))

    return DiagnoseOptions(
        steps=args.steps,
        warmup=args.warmup,
        budget=args.budget,
        precision=args.precision,
        pool=getattr(args, "pool", _default("pool")),
        threshold=getattr(args, "threshold", _default("threshold")),
        strategy=getattr(args, "strategy", _default("strategy")),
        progress=not off("no_progress") and sys.stderr.isatty(),
        stage_costs=not off("no_stage_costs"),
        loader_memory=not off("no_memory"),
        startup=not off("no_startup"),
    )


def check_steps(args: argparse.Namespace) -> None:
    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be at least 1 and --warmup at least 0")


def workload_from_args(args: argparse.Namespace) -> tuple[Any, Any]:
    """(device, workload) for a single-SPEC subcommand, after checking --steps/--warmup."""
    from fastpipe.workloads._workload import load_workload

    check_steps(args)
    device = resolve_device(args.device, args.spec)
    return device, load_workload(args.spec, device, adapt=trainer_objects, **toy_options(args))


def trainer_objects(result: Any, device: Any, spec: str) -> Any:
    """A factory's ``(LightningModule, datamodule or loader)`` as a Workload of the module's own step (as
    ``fastpipe.integrations.lightning.diagnose`` builds it); None for anything else (``(loader, step)``, a Workload)."""
    from fastpipe.integrations import lightning

    if not lightning.is_module_pair(result):
        return None
    return lightning.workload(result[0], result[1], device, name=f"{spec} ({type(result[0]).__name__}, Lightning)")


def toy_options(args: argparse.Namespace) -> dict[str, Any]:
    """``toy_option_values`` for subcommands that take a single SPEC."""
    from fastpipe.workloads._workload import family_of

    return toy_option_values(args, family_of(args.spec) is not None)


OUTPUT_OPTIONS = ("json", "markdown", "plot", "fix_json", "patch")
"""The options a command writes files for; :func:`check_output_paths` checks each before any work."""


EXAMPLE_NAMES = {"json": "report.json", "markdown": "report.md", "plot": "report.png", "fix_json": "fix.json"}


def _writable_file_path(option: str, path: Path) -> None:
    """Prove ``path`` can be written by opening it for writing, as the write at the end will; leave nothing new.

    Why not ``os.access``: it answers from the permission bits, and a path it calls writable can still fail at the end
    (``/proc/x.json``, a read-only mount, a full or quota'd disk, a FUSE folder): a traceback after the whole run.
    An existing file is opened for appending (its content is kept) and left as it was; a new one is created, with
    any missing folders, then removed with the folders made for it, so a run that fails later leaves no empty file.
    """
    flag = f"--{option.replace('_', '-')}"
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name, e.g. {path / EXAMPLE_NAMES[option]}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {path} cannot be written: {parent} is a file")
            break
    if path.exists():
        with open(path, "a"):
            return
    made = [parent for parent in path.parents if not parent.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x"):
            pass
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        for folder in made:  # the deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def check_output_paths(args: argparse.Namespace) -> None:
    """Every ``--json``, ``--markdown``, ``--plot`` and ``--fix-json`` path proven writable before the work (opened
    for writing, see :func:`_writable_file_path`): one line, exit 2, not a traceback after minutes of measuring (and
    the files after a bad one never written). Nothing is left behind: a new file is removed again."""
    seen: dict[Path, str] = {}
    for option in OUTPUT_OPTIONS:
        path = getattr(args, option, None)
        if path is None:
            continue
        path = Path(path)
        key = Path(os.path.abspath(path))
        if key in seen:
            raise ConfigError(
                f"--{seen[key].replace('_', '-')} and --{option.replace('_', '-')} are the same file, {path}; give each its own"
            )
        seen[key] = option
        try:
            _writable_file_path(option, path)
        except OSError as exc:  # /proc, a read-only file system, a permission denied on the way, a name too long
            raise ConfigError(f"--{option.replace('_', '-')} {path} cannot be written: {exc.strerror or exc}") from None
    if getattr(args, "plot", None) is not None and importlib.util.find_spec("matplotlib") is None:
        raise OptionalDependencyError("--plot needs matplotlib: pip install 'fastpipe[plot]' (or leave --plot out)")


def write_outputs(result: Any, args: argparse.Namespace) -> None:
    """A result's table on stdout, plus the --json, --markdown and --plot files asked for."""
    print(result.to_table())
    for option, render in (("json", "to_json"), ("markdown", "to_markdown")):
        path = getattr(args, option, None)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(getattr(result, render)())
            print(f"wrote {path}")
    plot = getattr(args, "plot", None)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        print(f"wrote {result.plot(str(plot))}")
