"""Does the gain ``fastpipe fix`` measures hold once its patch is applied? (issue 41's check, on a real script)

For a training script in its folder (torchvision's reference ``train.py`` with its ``presets.py``, timm's
``train.py``, one of your own), this:

1. copies the folder twice (``original/``, ``patched/``) into a scratch folder, so nothing of yours is changed;
2. runs ``fastpipe fix --json fix.json --patch fix.diff -- python original/SCRIPT ARGS`` (the candidates built from the
   script's live loader and measured inside its loop, rotated);
3. applies ``fix.diff`` to ``patched/`` with ``patch -p0`` and says whether every ``collate_fn=`` argument of the
   script's files is still there;
4. with ``--run-args``, runs the patched script once to its end with those arguments (e.g. one epoch and its
   validation), to show it trains;
5. runs ``fastpipe compare --rounds R --expected GAIN -- python original/SCRIPT ARGS -- python patched/SCRIPT ARGS``:
   each script in its own loop, in rotated rounds, and prints how much of fix's gain held (within 25%, with noise
   narrower than that, or not shown).

Every figure printed comes from this run; the load average before and after is printed with it.

Usage:
    python benchmarks/bench_fix_patch.py --folder /path/to/tv --script train.py [--budget 20] [--rounds 6]
        [--steps 30] [--run-args "--epochs 1"] [--out DIR] -- ARGS ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _fastpipe(args: list[str], cwd: Path, log: Path) -> int:
    """``python -m fastpipe ARGS`` in ``cwd``, its output teed into ``log`` (the script's epoch lines included)."""
    command = [sys.executable, "-m", "fastpipe", *args]
    print(f"$ (cd {cwd} && {shlex.join(command)})", flush=True)
    with log.open("w") as out:
        done = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)
    return done.returncode


def _collate_args(folder: Path) -> int:
    return sum(len(re.findall(r"\bcollate_fn\s*=", p.read_text())) for p in folder.glob("*.py"))


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    split = words.index("--") if "--" in words else len(words)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="the script's folder (copied, never changed)")
    parser.add_argument("--script", default="train.py")
    parser.add_argument("--budget", type=float, default=20.0, help="fix's seconds per rung (default 20)")
    parser.add_argument("--rounds", type=int, default=6, help="compare's rounds (default 6)")
    parser.add_argument("--steps", type=int, default=30, help="compare's timed steps per run (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="compare's untimed steps per run (default 5)")
    parser.add_argument("--run-args", default=None, help="run the patched script once to its end with these arguments")
    parser.add_argument("--out", type=Path, default=None, help="keep the copies, logs and JSON here (default: a temp folder)")
    args = parser.parse_args(words[:split])
    script_args = words[split + 1 :]
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_fix_patch_"))
    original, patched = out / "original", out / "patched"
    for copy in (original, patched):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(args.folder, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pth"))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()[0]:.2f}; copies in {out}")

    fix_json, diff = out / "fix.json", out / "fix.diff"
    fix_args = ["fix", "--budget", f"{args.budget:g}", "--no-progress", "--json", str(fix_json), "--patch", str(diff)]
    code = _fastpipe([*fix_args, "--", "python", args.script, *script_args], original, out / "fix.log")
    log = (out / "fix.log").read_text()
    title = re.search(r"^fastpipe fix .* on \S+(, device step|; original| \()", log, re.M)  # the report's title line
    print(log[title.start() :] if title else log[-6000:])
    if code != 0 or not fix_json.exists():
        print(f"fastpipe fix exited {code}: see {out / 'fix.log'}")
        return 1
    report = json.loads(fix_json.read_text())
    best = next((r for r in report["results"] if r["name"] == report["best"]), None)
    if best is None or not diff.exists():
        print("No patch: fix recommended nothing, or its patch could not be written (the reasons are above).")
        return 0

    before = _collate_args(patched)
    done = subprocess.run(["patch", "-p0"], input=diff.read_text(), text=True, capture_output=True, cwd=patched)
    print(done.stdout.strip())
    if done.returncode != 0:
        print(f"the patch did not apply: {done.stderr.strip()}")
        return 1
    after = _collate_args(patched)
    print(f"collate_fn= arguments in the script's files: {before} before the patch, {after} after")
    if args.run_args is not None:
        run = [sys.executable, args.script, *script_args, *shlex.split(args.run_args)]
        started = time.perf_counter()
        ran = subprocess.run(run, cwd=patched, capture_output=True, text=True)
        print(f"the patched script with {args.run_args!r}: exit {ran.returncode} in {time.perf_counter() - started:.0f} s")
        if ran.returncode != 0:
            print(ran.stderr[-3000:])
            return 1

    compare_json = out / "compare.json"
    compare_args = ["compare", "--rounds", str(args.rounds), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    compare_args += ["--expected", f"{best['gain']:.4f}", "--no-progress", "--json", str(compare_json)]
    command = [*compare_args, "--", "python", str(original / args.script), *script_args]
    command += ["--", "python", str(patched / args.script), *script_args]
    code = _fastpipe(command, out, out / "compare.log")
    print("\n".join(line for line in (out / "compare.log").read_text().splitlines() if line.startswith(("fastpipe compare", "  "))))
    if code != 0 or not compare_json.exists():
        print(f"fastpipe compare exited {code}: see {out / 'compare.log'}")
        return 1
    held = json.loads(compare_json.read_text())
    print(
        f"\nfix measured {best['name']}: {best['gain']:+.0%} ({report['original_ms']:.0f} -> {best['ms_per_step']:.0f} ms a "
        f"step); the patched script against the original: {held['gain']:+.0%} ± {held['noise']:.0%}; "
        f"{held['verdict']}; load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
