"""The GPU check's two helpers: sample GPU utilisation around a command, and print one results table.

    gpu_table.py sample --out UTIL.json [--gpu N | --no-gpu] -- COMMAND...
        runs COMMAND, sampling GPU utilisation (nvidia-ml-py, else nvidia-smi) meanwhile, and writes
        the samples with COMMAND's exit status; exits with that status.
    gpu_table.py table --device DEV --run NAME=DIAGNOSE.json[,UTIL.json] ... [--json OUT.json]
        prints steps/s, % of the device bound and GPU utilisation per workload, from the JSON that
        ``fastpipe diagnose --json`` wrote.

Standard library only, so it runs wherever the GPU check does. Utilisation is NVML's
"a kernel was running" percentage, sampled over the whole diagnosis (every experiment).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

Reader = Callable[[], float]
TIMEOUT_RC = (124, 137)  # what `timeout` returns when it had to stop the command


def nvml_index(cuda_index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES (when numeric) renumbers them for CUDA."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


def _nvml_reader(index: int) -> Reader | None:
    """Utilisation through nvidia-ml-py, or None when it is not installed or finds no driver or GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetUtilizationRates(handle)
    except Exception as exc:  # ImportError, or pynvml.NVMLError for any driver problem
        print(f"gpu_table: nvidia-ml-py unavailable ({type(exc).__name__}: {exc}); trying nvidia-smi", file=sys.stderr)
        return None
    return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)


def _smi_reader(index: int) -> Reader | None:
    """Utilisation through the nvidia-smi command, or None when it is missing or cannot answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    command = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", str(index)]

    def read() -> float:
        return float(subprocess.run(command, capture_output=True, text=True, timeout=5, check=True).stdout.split()[0])

    try:
        read()
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        print(f"gpu_table: nvidia-smi cannot report utilisation ({exc})", file=sys.stderr)
        return None
    return read


def utilisation_reader(cuda_index: int) -> tuple[Reader | None, str]:
    """A function returning the GPU's utilisation in percent, and its source; ``(None, "n/a")`` if none works."""
    index = nvml_index(cuda_index)
    reader = _nvml_reader(index)
    if reader is not None:
        return reader, "nvidia-ml-py"
    reader = _smi_reader(index)
    return (reader, "nvidia-smi") if reader is not None else (None, "n/a")


def sample_while(command: Sequence[str], reader: Reader | None, interval_s: float) -> tuple[int, list[float], float]:
    """Run ``command``; meanwhile call ``reader`` every ``interval_s``. Returns (exit status, samples, wall s)."""
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            try:
                samples.append(reader())  # type: ignore[misc]
            except Exception as exc:  # a failed read is a gap in the samples, not a failed check
                print(f"gpu_table: a utilisation sample failed: {exc}", file=sys.stderr)

    start = time.perf_counter()
    child = subprocess.Popen(list(command))
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # an outer timeout stops the child too
    thread = threading.Thread(target=sample, daemon=True) if reader is not None else None
    if thread is not None:
        thread.start()
    try:
        returncode = child.wait()
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        signal.signal(signal.SIGTERM, previous)
    return returncode, samples, time.perf_counter() - start


def baseline(diagnosis: dict[str, Any]) -> dict[str, Any] | None:
    """The experiment that runs the workload as it is: named "baseline", else the one with no cache point, else the first."""
    experiments = diagnosis.get("experiments") or []
    for test in (lambda e: e.get("name") == "baseline", lambda e: e.get("cache_point") in (None, "", "none")):
        for experiment in experiments:
            if test(experiment):
                return experiment
    return experiments[0] if experiments else None


def _number(value: Any) -> float | None:
    """A finite number from the JSON, or None (the report writes NaN for what it could not measure)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _missing_reason(util: dict[str, Any] | None) -> str:
    """Why a workload has no diagnosis JSON, from what the sampler recorded about its command."""
    if util is None:
        return "not run"
    returncode = util.get("returncode")
    if returncode in TIMEOUT_RC:
        return f"timed out after {util.get('wall_s', 0):.0f} s"
    if returncode == 0:
        return "exit 0 but no JSON written"
    return f"failed (exit {returncode}), no JSON"


def summarize(name: str, diagnosis: dict[str, Any] | None, util: dict[str, Any] | None) -> dict[str, Any]:
    """One table row: the baseline's steps/s and share of the device bound, and GPU utilisation."""
    samples = (util or {}).get("samples") or []
    returncode = (util or {}).get("returncode")
    row: dict[str, Any] = {
        "workload": name,
        "status": "ok",
        "steps_per_s": None,
        "device_bound_steps_per_s": None,
        "pct_of_bound": None,
        "gpu_util_mean": statistics.fmean(samples) if samples else None,
        "gpu_util_max": max(samples) if samples else None,
        "gpu_util_source": (util or {}).get("source", "n/a"),
        "verdict": None,
    }
    if diagnosis is None:
        row["status"] = _missing_reason(util)
        return row
    if returncode not in (None, 0):
        row["status"] = f"exit {returncode}"
    bound = _number(diagnosis.get("device_bound_steps_per_s"))
    experiment = baseline(diagnosis)
    row["device_bound_steps_per_s"] = bound
    row["verdict"] = diagnosis.get("verdict")
    if experiment is not None:
        row["steps_per_s"] = _number(experiment.get("steps_per_s"))
        fraction = _number(experiment.get("fraction_of_bound"))
        if fraction is None and bound and row["steps_per_s"] is not None:
            fraction = row["steps_per_s"] / bound
        row["pct_of_bound"] = None if fraction is None else 100.0 * fraction
    return row


def _cell(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_table(rows: list[dict[str, Any]], device: str) -> str:
    """The table as text: one line per workload, then the verdicts and what the numbers mean."""
    header = ("workload", "steps/s", "device bound", "% of bound", "GPU util mean", "GPU util max", "status")
    lines = [
        (
            row["workload"],
            _cell(row["steps_per_s"], ".2f"),
            _cell(row["device_bound_steps_per_s"], ".2f"),
            _cell(row["pct_of_bound"], ".0f"),
            _cell(row["gpu_util_mean"], ".0f") + ("" if row["gpu_util_mean"] is None else " %"),
            _cell(row["gpu_util_max"], ".0f") + ("" if row["gpu_util_max"] is None else " %"),
            row["status"],
        )
        for row in rows
    ]
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    text = [f"fastpipe GPU check on {device}: baseline (nothing cached) per workload"]
    for line in [header, tuple("-" * w for w in widths), *lines]:
        text.append("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())
    text += [f"{row['workload']}: {row['verdict']}" for row in rows if row["verdict"]]
    sources = sorted({row["gpu_util_source"] for row in rows})
    text.append(f"GPU util: {', '.join(sources)}; sampled over the whole diagnosis, every experiment included.")
    if not device.startswith("cuda"):
        text.append(f"{device} is not a GPU: this is a dry run, and the GPU table still awaits a GPU.")
    return "\n".join(text)


def _load(path: str | None) -> dict[str, Any] | None:
    if not path or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        print(f"gpu_table: {path} is not valid JSON ({exc}); treating it as missing", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser("sample", help="run a command, sampling GPU utilisation")
    sample.add_argument("--out", required=True, help="where to write the samples (JSON)")
    sample.add_argument("--gpu", type=int, default=0, help="CUDA index of the GPU to sample (default 0)")
    sample.add_argument("--no-gpu", action="store_true", help="do not sample (the device is not a GPU)")
    sample.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    sample.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND...")
    table = commands.add_parser("table", help="print the results table")
    table.add_argument("--device", required=True)
    table.add_argument("--run", action="append", default=[], metavar="NAME=DIAGNOSE.json[,UTIL.json]")
    table.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)

    if args.command == "sample":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            parser.error("sample needs a command after --")
        reader, source = (None, "n/a") if args.no_gpu else utilisation_reader(args.gpu)
        returncode, samples, wall_s = sample_while(cmd, reader, args.interval)
        record = {
            "command": cmd,
            "returncode": returncode,
            "wall_s": wall_s,
            "source": source,
            "interval_s": args.interval,
            "samples": samples,
        }
        Path(args.out).write_text(json.dumps(record, indent=2))
        return returncode

    rows = []
    for run in args.run:
        name, sep, paths = run.partition("=")
        if not sep:
            parser.error(f"--run {run!r}: expected NAME=DIAGNOSE.json[,UTIL.json]")
        diagnose_path, _, util_path = paths.partition(",")
        rows.append(summarize(name, _load(diagnose_path), _load(util_path)))
    print(format_table(rows, args.device))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
