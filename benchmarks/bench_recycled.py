"""End to end: toy:optimized against toy:recycled (the same pipeline with recycled batch memory), side by side.

Each comparison is one ``fastpipe.compare`` run (the device bound and both variants measured in
the same run) on a simulated device. Without CUDA the sim device models the stock loader's
pinning as a copy into fresh memory (``SimDevice.pin``), which pays page faults on the
destination as well; a CUDA machine's caching pinned allocator reuses its pinned blocks. So each
device is measured twice: with the sim's own pinning model, and with a model that copies into
reused buffers like that allocator (the conservative figure for the recycled rung, since its
saving on the pinning side is then smallest). Targets (issue 15): the recycled rung at least
1.25x toy:optimized at sim:50; at sim:97 and sim:290 at least 97% of the bound.

sim:50 was chosen on the machine the issue came from, where toy:optimized reached only 47% of
that bound: its workers' CPU was the limit. Machines of this kind differ twice over in speed per
sample, and where toy:optimized already runs near sim:50's bound, no rung can add 1.25x (at 92%
of the bound, the most is 1/0.92 = 1.09x). So the speed target is also checked on the same
footing on this machine (skipped with ``--no-scaled``): toy:optimized's own time per step against
a device too fast to wait for (sim:1) is measured first, and the device step is set to 47% of it,
where toy:optimized is as starved as it was at sim:50 there. The script prints what sim:50 leaves
to gain here, so the two checks can be read side by side.

Usage:
    python benchmarks/bench_recycled.py [--devices sim:50 sim:97 sim:290] [--steps 10] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import defaultdict
from typing import Any, Iterator

import torch

from fastpipe import MeasureOptions
from fastpipe._tree import map_tensors
from fastpipe.devices import SimDevice
from fastpipe.experiments._compare import compare

SPEED_TARGET = 1.25
BOUND_TARGET = 0.97
# toy:optimized's fraction of the bound at sim:50 on the machine issue 15 was written on (its
# "quick trial" with the asynchronous step): the starvation the speed target was set for.
ISSUE_OPTIMIZED_OF_BOUND = 0.47
SPEED_TARGET_DEVICE = "sim:50"


def scaled_device(steps: int, warmup: int) -> tuple[str, float]:
    """The sim step at which toy:optimized is as starved on this machine as at sim:50 on the issue's.

    Returns the device spec and toy:optimized's own time per step (ms) against sim:1, a device
    it cannot keep up with, i.e. what its loader can deliver on this machine.
    """
    result = compare(["toy:optimized"], device="sim:1", options=MeasureOptions(steps=steps, warmup=warmup), memory=False)
    own_ms = 1000.0 / result.variants[0].steps_per_s
    return f"sim:{max(1, round(own_ms * ISSUE_OPTIMIZED_OF_BOUND))}", own_ms


@contextlib.contextmanager
def cached_pinning(buffers_per_shape: int = 8) -> Iterator[None]:
    """SimDevice.pin copies into a few reused buffers per shape, as CUDA's caching pinned allocator would.

    The sim's step never reads the values, so reusing a buffer that a batch still "uses" changes
    no result; only the copy's cost is modelled.
    """
    pools: dict[tuple[Any, ...], list[torch.Tensor]] = defaultdict(list)
    turn: dict[tuple[Any, ...], int] = defaultdict(int)
    original = SimDevice.pin

    def pin(self: SimDevice, batch: Any) -> Any:
        def pin_tensor(tensor: torch.Tensor) -> torch.Tensor:
            if self.is_pinned(tensor):
                return tensor
            key = (tuple(tensor.shape), tensor.dtype)
            pool = pools[key]
            if len(pool) < buffers_per_shape:
                pool.append(torch.empty_like(tensor, memory_format=torch.contiguous_format))
            target = pool[turn[key] % len(pool)]
            turn[key] += 1
            target.copy_(tensor)
            return self.mark_pinned(target.view_as(target))

        return map_tensors(pin_tensor, batch)

    SimDevice.pin = pin  # type: ignore[method-assign]
    try:
        yield
    finally:
        SimDevice.pin = original  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", nargs="+", default=["sim:50", "sim:97", "sim:290"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="runs per device and pinning model (the spread is printed)")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument(
        "--no-scaled", dest="scaled", action="store_false", help="skip the device scaled to this machine (see the module docstring)"
    )
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    # (device, check, label): the speed check at sim:50, the no-regression check at the others, and
    # the speed check again at the scaled device (beside any check that device already has).
    checks = [(spec, "speed" if spec == SPEED_TARGET_DEVICE else "bound", "") for spec in args.devices]
    devices = list(args.devices)
    scaled = None
    if args.scaled:
        scaled, own_ms = scaled_device(args.steps, args.warmup)
        print(
            f"toy:optimized alone against sim:1: {own_ms:.0f} ms per step on this machine; "
            f"{ISSUE_OPTIMIZED_OF_BOUND:.0%} of that is {scaled}, the step where it is as starved as at "
            f"{SPEED_TARGET_DEVICE} on the machine issue 15 came from"
        )
        if (scaled, "speed", "") not in checks:
            checks.append((scaled, "speed", " (scaled to this machine)"))
        if scaled not in devices:
            devices.append(scaled)
    print(f"toy:optimized vs toy:recycled, {args.steps} steps after {args.warmup} warm-up, each pair measured in one compare run")
    print(f"{'device':<8} {'stock pinning model':<34} {'optimized':>10} {'recycled':>10} {'ratio':>6} {'recycled/bound':>15}")
    for spec in devices:
        for model in ("sim: copy into fresh memory", "cached: copy into reused buffers"):
            for _ in range(args.repeats):
                pinning = cached_pinning() if model.startswith("cached") else contextlib.nullcontext()
                with pinning:
                    result = compare(
                        ["toy:optimized", "toy:recycled"],
                        device=spec,
                        options=MeasureOptions(steps=args.steps, warmup=args.warmup),
                        memory=False,
                    )
                optimized, recycled = result.variants
                ratio = recycled.steps_per_s / optimized.steps_per_s
                runs.append(
                    {
                        "device": spec,
                        "pinning_model": model,
                        "optimized": optimized.steps_per_s,
                        "recycled": recycled.steps_per_s,
                        "ratio": ratio,
                        "recycled_of_bound": recycled.fraction_of_bound,
                        "optimized_of_bound": optimized.fraction_of_bound,
                        "bound": result.device_bound_steps_per_s,
                    }
                )
                print(
                    f"{spec:<8} {model:<34} {optimized.steps_per_s:10.2f} {recycled.steps_per_s:10.2f} {ratio:6.2f} "
                    f"{recycled.fraction_of_bound:15.1%}",
                    flush=True,
                )
    print("\ntargets (issue 15):")
    ok = True
    for spec, check, label in checks:
        mine = [r for r in runs if r["device"] == spec]
        if check == "speed":
            worst = min(r["ratio"] for r in mine)
            passed = worst >= SPEED_TARGET
            most = 1.0 / max(r["optimized_of_bound"] for r in mine)
            print(
                f"  {spec}{label}: recycled / optimized >= {SPEED_TARGET}x in every run: lowest {worst:.2f}x -> "
                f"{'PASS' if passed else 'FAIL'}; toy:optimized reached up to {1 / most:.0%} of the bound, "
                f"so no rung could add more than {most:.2f}x in that run"
            )
            # sim:50 is excused only when another device carries the target and every run that
            # missed it had no room to meet it (toy:optimized too near the bound in that same run).
            failing = [r for r in mine if r["ratio"] < SPEED_TARGET]
            out_of_reach = all(1.0 / r["optimized_of_bound"] < SPEED_TARGET for r in failing)
            if spec == SPEED_TARGET_DEVICE and scaled is not None and scaled != spec and failing and out_of_reach:
                print(
                    f"    out of reach at {spec} in every failing run on this machine, so this line does not decide "
                    f"the exit status: the scaled device {scaled} carries the speed target"
                )
                continue
        else:
            worst = min(r["recycled_of_bound"] for r in mine)
            passed = worst >= BOUND_TARGET
            print(
                f"  {spec}: recycled >= {BOUND_TARGET:.0%} of the bound in every run: lowest {worst:.1%} -> {'PASS' if passed else 'FAIL'}"
            )
        ok &= passed
    print("(a 2-core machine shared with other users: repeat, and read the spread, before trusting one run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
