"""What script mode's handoff adds to each step of the script's loop (``fastpipe diagnose -- python SCRIPT``).

In script mode the ladder runs in its own thread and hands each batch to the script's ``next()``
(:mod:`fastpipe.diagnosis._handoff`): two condition-variable wake-ups per step. Every cache point pays it alike,
so it cancels in each stage's difference, but it is part of each point's absolute ms/step. Two figures, interleaved
rounds, medians:

1. the handoff alone: a loop over ready batches that does nothing, direct against through the handoff;
2. a 5 ms step (a busy-wait, CPU time like a real step's launches) both ways: the ratio of the two loops' times.

    python benchmarks/bench_handoff.py [--steps 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from fastpipe.diagnosis._handoff import Handoff


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def direct_s(steps: int, step_ms: float) -> float:
    start = time.perf_counter()
    for i in range(steps):
        if step_ms:
            busy(step_ms)
    return time.perf_counter() - start


def handoff_s(steps: int, step_ms: float) -> float:
    """The script's loop in this thread, fed by an engine thread through a Handoff (as in script mode)."""
    handoff = Handoff(budget_steps=steps + 1)

    def engine() -> None:
        try:
            for i in range(steps):
                handoff.step(i)
        finally:
            handoff.finish(None)

    thread = threading.Thread(target=engine, name="fastpipe-bench")
    start = time.perf_counter()
    thread.start()
    while True:
        ok, _ = handoff.request()
        if not ok:
            break
        if step_ms:
            busy(step_ms)
    thread.join()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for step_ms in (0.0, 5.0):
        steps = args.steps if step_ms == 0 else max(50, args.steps // 10)
        direct, handed = [], []
        for _ in range(args.rounds):
            direct.append(direct_s(steps, step_ms) / steps)
            handed.append(handoff_s(steps, step_ms) / steps)
        d, h = statistics.median(direct), statistics.median(handed)
        ratio = f" (ratio {h / d:.3f})" if step_ms else ""
        print(
            f"step {step_ms:g} ms, {steps} steps x {args.rounds} rounds: direct {1e6 * d:.1f} us/step, "
            f"through the handoff {1e6 * h:.1f} us/step: {1e6 * (h - d):+.1f} us/step{ratio}"
        )


if __name__ == "__main__":
    main()
