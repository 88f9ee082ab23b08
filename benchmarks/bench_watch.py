"""What ``fastpipe.watch`` costs per step, against a 20 ms training step (issue 22: under 1%).

Two figures from one run:

1. the watch's own cost per step: iterating a list of ready batches with and without the watch, interleaved,
   median of rounds (the loop does nothing else, so the difference is the watch: two clock reads, a few
   additions, one append, and the summary line at the end of each epoch);
2. a 20 ms step (a busy-wait, so it is CPU time like a real step's launch work) over a ready loader, with and
   without the watch, interleaved: the ratio of the two loops' times (noisier; it shows the first is all there is).

    python benchmarks/bench_watch.py [--steps 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fastpipe

STEP_MS = 20.0


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def loop_s(batches, step_ms: float) -> float:
    start = time.perf_counter()
    for _ in batches:
        if step_ms:
            busy(step_ms)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per round for the per-step cost")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--step-rounds", type=int, default=5, help="rounds of 100 steps of 20 ms for the ratio")
    args = parser.parse_args()
    batches = [torch.zeros(2) for _ in range(args.steps)]

    plain, watched = [], []
    for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits both alike
        plain.append(loop_s(batches, 0) / args.steps)
        watched.append(loop_s(fastpipe.watch(batches, echo=False, memory=False), 0) / args.steps)
    per_step_us = 1e6 * (statistics.median(watched) - statistics.median(plain))
    print(
        f"1. per-step cost of the watch: {per_step_us:.2f} us (median of {args.rounds} rounds of {args.steps} steps; "
        f"plain loop {1e6 * statistics.median(plain):.2f} us/step)"
    )
    print(
        f"   = {per_step_us / (10 * STEP_MS):.4f}% of a {STEP_MS:.0f} ms step (target < 1%): "
        f"{'PASS' if per_step_us / 1000 < 0.01 * STEP_MS else 'FAIL'}"
    )

    ready = batches[:100]
    plain_s, watched_s = [], []
    for _ in range(args.step_rounds):
        plain_s.append(loop_s(ready, STEP_MS))
        watched_s.append(loop_s(fastpipe.watch(ready, echo=False), STEP_MS))  # with memory figures at epoch end
    ratio = statistics.median(watched_s) / statistics.median(plain_s)
    print(
        f"2. 100 steps of {STEP_MS:.0f} ms: watched / plain = {ratio:.4f} (median of {args.step_rounds} interleaved rounds; "
        "includes one summary with memory figures per round)"
    )
    print("(2 cores shared with other users: medians of interleaved rounds)")


if __name__ == "__main__":
    main()
