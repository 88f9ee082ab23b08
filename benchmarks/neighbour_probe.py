"""Issue 32's question, measured: where does a DataLoader worker's main thread lose wall time inside ``__getitem__``?

    .venv/bin/python benchmarks/neighbour_probe.py [--neighbour none|training|busy] [--batches 60] [--burn-ms 3]

A planted pipeline (the raw load makes a random uint8 image, 0.1-0.2 ms of CPU; one transform burns ``--burn-ms``
of the thread's CPU) runs in 2 DataLoader workers, with no timing harness but this probe's. Around each segment of
a worker's main thread (the raw load, the transform, and the time between two samples: the loader's fetch loop and
collate) it reads, on the main thread: wall, CPU and run-queue time (``/proc/thread-self/schedstat``), voluntary and
involuntary context switches and page faults (``getrusage(RUSAGE_THREAD)``); and for the *other* threads of the
worker (the queue's feeder thread, which pickles the previous batch into shared memory while holding the GIL) their
CPU and run-queue time over the same segment (``/proc/self/task/<tid>/schedstat``). The feeder's pickling calls are
timed too (wall and CPU of each ``ForkingPickler.dumps``). It prints, per segment and per sample: wall, CPU, run
queue, blocked (wall - CPU - run queue), the other threads' CPU and run queue in the same segment, and the switches.

The reading: a main thread that is blocked while another thread of its process runs or waits for a core is waiting
for the GIL (or a lock) that thread holds: that time is the other thread's, not the segment's.

``--naive`` reads the clocks as fastpipe's ledger did before issue 32 (wall, then CPU, then run queue, once), where
the default reading is taken again when the thread's context switches moved during it. Reading the CPU clock makes
the kernel check the thread's time slice, so a thread whose slice is spent is preempted on the way back from that
call, inside the reading: naively, that preemption's wall time lands in one segment and its run-queue time in the
next, and a segment that computes shows "blocked" time it never had. The count of readings taken again is printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import neighbour_job  # noqa: E402

FIELDS = ("wall", "cpu", "runq", "other_cpu", "other_runq", "nvcsw", "nivcsw", "minflt")


class _Clocks:
    """The main thread's clocks and the other threads' schedstat, read together."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        self.tid = os.path.basename(os.readlink("/proc/thread-self"))
        self.others: dict[str, int] = {}

    def _other_fds(self) -> list[int]:
        for tid in os.listdir("/proc/self/task"):
            if tid != self.tid and tid not in self.others:
                try:
                    self.others[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                except OSError:
                    pass
        return list(self.others.values())

    naive = False
    retried = 0

    def read(self) -> tuple[float, ...]:
        for attempt in range(4):
            before = resource.getrusage(resource.RUSAGE_THREAD)
            values = self._read()
            after = resource.getrusage(resource.RUSAGE_THREAD)
            if self.naive or (before.ru_nvcsw, before.ru_nivcsw) == (after.ru_nvcsw, after.ru_nivcsw):
                break
            _Clocks.retried += 1
        return values

    def _read(self) -> tuple[float, ...]:
        wall = time.perf_counter()
        cpu, runq = time.thread_time(), int(os.pread(self.fd, 128, 0).split()[1]) / 1e9
        other_cpu = other_runq = 0.0
        for fd in self._other_fds():
            try:
                c, q = (int(v) / 1e9 for v in os.pread(fd, 128, 0).split()[:2])
            except (OSError, ValueError):
                continue
            other_cpu, other_runq = other_cpu + c, other_runq + q
        ru = resource.getrusage(resource.RUSAGE_THREAD)
        return (wall, cpu, runq, other_cpu, other_runq, ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_minflt)


_STATE: dict[str, Any] = {}


def _probe() -> tuple[_Clocks, dict[str, list[float]]]:
    if _STATE.get("pid") != os.getpid():
        _STATE.update(pid=os.getpid(), clocks=_Clocks(), acc={}, last=None, pickles=[0.0, 0.0, 0])
        _wrap_pickler(_STATE["pickles"])
    return _STATE["clocks"], _STATE["acc"]


def _wrap_pickler(into: list[float]) -> None:
    """Time the feeder thread's pickling (``multiprocessing.queues._ForkingPickler.dumps``) in this worker."""
    import multiprocessing.queues as q

    original = q._ForkingPickler.dumps

    def dumps(obj: Any, protocol: Any = None) -> Any:
        w, c = time.perf_counter(), time.thread_time()
        out = original(obj, protocol)
        into[0] += time.perf_counter() - w
        into[1] += time.thread_time() - c
        into[2] += 1
        return out

    q._ForkingPickler.dumps = dumps  # type: ignore[method-assign]


def _add(acc: dict[str, list[float]], name: str, a: tuple[float, ...], b: tuple[float, ...]) -> None:
    row = acc.setdefault(name, [0.0] * len(FIELDS))
    for i in range(len(FIELDS)):
        row[i] += b[i] - a[i]


class Burn:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        end = time.thread_time() + self.ms / 1000
        while time.thread_time() < end:
            pass
        return x


class Planted(Dataset):
    def __init__(self, burn_ms: float) -> None:
        self.transform = Burn(burn_ms)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        clocks, acc = _probe()
        t0 = clocks.read()
        if _STATE["last"] is not None:
            _add(acc, "between samples", _STATE["last"], t0)
        x = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)
        t1 = clocks.read()
        x = self.transform(x)
        t2 = clocks.read()
        _add(acc, "raw load", t0, t1)
        _add(acc, "transform", t1, t2)
        acc.setdefault("samples", [0.0])[0] += 1
        _STATE["last"] = t2
        return x, index % 10


def collate(samples: list[Any]) -> Any:
    batch = torch.utils.data.default_collate(samples)
    clocks, acc = _probe()
    report = {k: list(v) for k, v in acc.items()}
    report["pickles"] = list(_STATE["pickles"])
    report["retried"] = [float(_Clocks.retried)]
    _Clocks.retried = 0
    acc.clear()
    _STATE["pickles"][:] = [0.0, 0.0, 0]
    return batch, report


def run(batches: int, burn_ms: float, naive: bool = False) -> dict[str, list[float]]:
    _Clocks.naive = naive  # forked workers inherit it
    loader = DataLoader(Planted(burn_ms), batch_size=16, num_workers=2, collate_fn=collate)
    total: dict[str, list[float]] = {}
    for i, (_, report) in enumerate(loader):
        if i >= 4:  # warm-up: workers starting, the feeder thread not yet running
            for k, v in report.items():
                row = total.setdefault(k, [0.0] * len(v))
                for j, x in enumerate(v):
                    row[j] += x
        if i >= batches + 4:
            break
    return total


def show(total: dict[str, list[float]]) -> None:
    n = total["samples"][0]
    print(
        f"  per sample ({n:.0f} samples): ms wall, CPU, run queue, blocked, other threads' CPU and run queue; switches vol/invol; minor faults"
    )
    for name in ("raw load", "transform", "between samples"):
        v = total.get(name)
        if v is None:
            continue
        wall, cpu, runq, ocpu, oq, nv, niv, flt = (x / n for x in v)
        blocked = wall - cpu - runq
        print(
            f"  {name:16s} wall {1e3 * wall:6.2f}  cpu {1e3 * cpu:6.2f}  runq {1e3 * runq:6.2f}  blocked {1e3 * blocked:6.2f}  "
            f"| others cpu {1e3 * ocpu:5.2f} runq {1e3 * oq:5.2f}  | vcsw {nv:5.2f} ivcsw {niv:5.2f}  minflt {flt:6.1f}"
        )
    w, c, k = total["pickles"]
    print(f"  feeder pickling: {1e3 * w / n:.2f} ms wall, {1e3 * c / n:.2f} ms CPU per sample ({k:.0f} calls)")
    print(f"  readings taken again (a switch inside them): {total['retried'][0] / n:.2f} a sample")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbour", choices=("none", "training", "busy"), default="none")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--burn-ms", type=float, default=3.0)
    parser.add_argument("--naive", action="store_true", help="read the clocks once, in the order the ledger used before")
    args = parser.parse_args()
    print(
        f"neighbour: {args.neighbour}; {'naive' if args.naive else 'retried'} readings; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    proc = None if args.neighbour == "none" else neighbour_job.start(args.neighbour)
    try:
        show(run(args.batches, args.burn_ms, args.naive))
    finally:
        if proc is not None:
            neighbour_job.stop(proc)


if __name__ == "__main__":
    main()
