"""Does script mode time the script's step as the script runs on its own? (the baseline inside the loop against native)

``fastpipe diagnose -- python SCRIPT ARGS`` measures each cache point inside the script's own loop; its baseline
point is the script's own pipeline and step, so its ms/step should be what the script takes a step without fastpipe.
This runs, in alternating rounds, in the script's folder:

* **native**: the script in a process of its own, its training loader's steps timed between ``next()`` calls and
  nothing else of fastpipe's (the child ``fastpipe compare`` runs, ``python -m fastpipe.experiments._compare_scripts
  --child``): the median of ``--steps`` steps after ``--warmup``;
* **in the loop**: ``fastpipe diagnose --json`` on the same command; the baseline point's ms/step (a mean, with its
  standard error) and the device point's;

and prints each round's figures and their ratio (in the loop / native), then the ratios' median and range. A ratio
far from 1 means the ladder measured a regime the script does not train in.

Run it against another checkout of fastpipe with ``PYTHONPATH=/that/checkout`` (the children inherit it), e.g. to
measure a change's effect, one after the other on a quiet machine.

Usage:
    python benchmarks/bench_script_fidelity.py --folder DIR [--script train.py] [--rounds 2] [--budget 10]
        [--steps 60] [--warmup 5] -- ARGS ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"{' '.join(command[:6])} ... exited {done.returncode}:\n{tail}")


def native_ms(folder: Path, script: str, args: list[str], warmup: int, steps: int, out: Path) -> float:
    """The median step time (ms) of the script on its own."""
    command = [sys.executable, "-m", "fastpipe.experiments._compare_scripts", "--child", "--warmup", str(warmup)]
    _run([*command, "--steps", str(steps), "--out", str(out), "--", "python", script, *args], folder)
    result = json.loads(out.read_text())
    if result.get("error") or not result["step_s"]:
        raise SystemExit(f"the native run did not time its steps: {result.get('error')}")
    return 1000 * statistics.median(result["step_s"])


def in_loop_ms(folder: Path, script: str, args: list[str], budget: float, out: Path) -> tuple[float, float, float | None]:
    """(baseline ms/step, its standard error, device ms/step) from ``fastpipe diagnose --json`` in the script's loop."""
    command = [sys.executable, "-m", "fastpipe", "diagnose", "--budget", f"{budget:g}", "--no-progress", "--no-stage-costs"]
    _run([*command, "--no-memory", "--json", str(out), "--", "python", script, *args], folder)
    report = json.loads(out.read_text())
    points = {e["cache_point"]: e for e in report["experiments"]}
    if "baseline" not in points:
        raise SystemExit("the diagnosis measured no baseline point (the script ended first? give it more epochs)")
    device = points.get("device")
    return points["baseline"]["ms_per_step"], points["baseline"]["stderr_ms"], device["ms_per_step"] if device else None


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    split = words.index("--") if "--" in words else len(words)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="the script's folder (run there, never changed)")
    parser.add_argument("--script", default="train.py")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=10.0, help="diagnose's seconds per cache point (default 10)")
    parser.add_argument("--steps", type=int, default=60, help="native steps timed per round (default 60)")
    parser.add_argument("--warmup", type=int, default=5)
    options = parser.parse_args(words[:split])
    args = words[split + 1 :]
    code = os.environ.get("PYTHONPATH") or "this checkout (the installed fastpipe)"
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()[0]:.2f}; fastpipe from {code}")
    print(f"# {options.script} {' '.join(args)}")
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(options.rounds):
            order = ("native", "loop") if r % 2 == 0 else ("loop", "native")
            figures: dict[str, float] = {}
            for which in order:
                if which == "native":
                    figures["native"] = native_ms(
                        options.folder, options.script, args, options.warmup, options.steps, Path(scratch) / "n.json"
                    )
                else:
                    base, err, device = in_loop_ms(options.folder, options.script, args, options.budget, Path(scratch) / "d.json")
                    figures["loop"], figures["err"] = base, err
                    figures["device"] = device if device is not None else float("nan")
            ratio = figures["loop"] / figures["native"]
            ratios.append(ratio)
            print(
                f"round {r + 1} ({' then '.join(order)}): native {figures['native']:.1f} ms/step (median); in the loop: "
                f"baseline {figures['loop']:.1f} ± {figures['err']:.1f} ms/step, device point {figures['device']:.1f}; "
                f"in the loop / native = {ratio:.2f}"
            )
    print(
        f"in the loop / native over {len(ratios)} round(s): median {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}); load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
