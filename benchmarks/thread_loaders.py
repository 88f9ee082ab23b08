"""bench_jpeg.py's thread-loader section (issue 25): images/s and memory of whole loaders, side by side in one run.

Loaders, each over the same files, 224x224 RandomResizedCrop + flip, batch ``--batch``:

* ``thread-loader (1 thread)``, ``thread-loader (2 threads)``: :class:`fastpipe.datasets.ThreadLoader`;
* ``dataloader+fastpipe (2 workers)``: ``DataLoader(fastpipe.datasets.ImageFolder, num_workers=2, persistent_workers=True)``;
* ``torchvision-v2 (2 workers)``: a DataLoader whose samples are torchvision.io.decode_jpeg + v2 crop and flip;
* ``dali-cpu (2 threads)``: DALI's CPU pipeline; ``spdl (2 threads)``: SPDL's crop + scale in a 2-thread pool.
  Each is a "not installed" (or "cannot run") row when absent.

Every round runs each loader for one epoch in a fresh random order; the table gives the median of
the rounds' images/s. In the same rounds, on one thread: the op alone (bytes read and boxes drawn
beforehand: only ``decode_jpeg_crop`` timed), and fastpipe's per-sample path and its entropy floor
(read, header, draw, then the decode or only the Huffman decoding it cannot skip), and the same sample
path with the op's resize forced to its portable kernels or skipped (not targets: what the AVX2 resize
gained and what the resize still costs).

Memory: each loader runs in a fresh process (``python benchmarks/thread_loaders.py --pss KIND``) for
one epoch; at its end, with the workers still alive, the PSS of that process and all its children
is summed from ``/proc/<pid>/smaps_rollup`` (PSS shares each page among the processes mapping it,
so the sum counts shared pages once).

Targets (issue 25), never lowered here: the thread loader with 2 threads at least 1.35x the
DataLoader's images/s, at least 2x DALI's, at least 85% of 2 / (the op's wall time per image on one thread, in the same rounds); its PSS
at most half the DataLoader's; the op at most 1.3x the entropy floor per sample. The PSS table also gives
what each loader added to a process that had already imported torch, torchvision and fastpipe: forked
workers share those libraries' pages with their parent, so the totals are mostly the runtime both pay.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

import fastpipe.ops.jpeg as fjpeg

SIZE = 224
KINDS = ("thread-loader-1", "thread-loader-2", "dataloader-fastpipe", "torchvision-v2", "dataloader-fastpipe-forkserver")
#: Measured for memory only (not timed, not a target): the same DataLoader with worker processes started by
#: forkserver, Python 3.14's default on Linux (and spawn, macOS's), where each worker imports torch itself.
FORKSERVER = "dataloader-fastpipe-forkserver"


def dataset_for(files: list[Path], size: int = SIZE) -> Any:
    """fastpipe's ImageFolder over exactly ``files`` (their parent folders as classes)."""
    from fastpipe.datasets import ImageFolder

    root = Path(os.path.commonpath([str(f.parent.parent) for f in files]))
    dataset = ImageFolder(root, size=size)
    keep = {str(f) for f in files}
    dataset.samples = [s for s in dataset.samples if s[0] in keep]
    dataset.imgs, dataset.targets = dataset.samples, [t for _, t in dataset.samples]
    return dataset


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)


def make_loader(kind: str, files: list[Path], batch: int) -> Any:
    """The loader ``kind`` over ``files``: something to iterate for one epoch."""
    from torch.utils.data import DataLoader

    from fastpipe.datasets import ThreadLoader

    if kind.startswith("thread-loader-"):
        return ThreadLoader(dataset_for(files), batch_size=batch, shuffle=True, threads=int(kind.rsplit("-", 1)[1]))
    if kind in ("dataloader-fastpipe", FORKSERVER):
        return DataLoader(
            dataset_for(files),
            batch_size=batch,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            worker_init_fn=_worker_init,
            multiprocessing_context="forkserver" if kind == FORKSERVER else None,
        )
    if kind == "torchvision-v2":
        from bench_jpeg import _Samples, main_candidates  # noqa: PLC0415  (the same recipe as bench_jpeg's rows)

        return DataLoader(
            _Samples(files, main_candidates()["torchvision-v2"][1]),
            batch_size=batch,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            worker_init_fn=_worker_init,
        )
    raise ValueError(f"unknown loader kind {kind!r}; one of {KINDS}")


#: CPU seconds each loader used in its epochs (this process's threads and its worker processes), by loader.
CPU_SECONDS: dict[int, list[float]] = {}


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its live child processes (DataLoader workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in _children(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        except (OSError, IndexError, ValueError):  # a worker that just exited
            continue
    return total


def epoch_of(loader: Any) -> Callable[[], float]:
    spent = CPU_SECONDS.setdefault(id(loader), [])

    def epoch() -> float:
        cpu = cpu_seconds()
        start = time.perf_counter()
        for _ in loader:
            pass
        wall = time.perf_counter() - start
        spent.append(cpu_seconds() - cpu)
        return wall

    epoch.cpu = spent  # type: ignore[attr-defined]

    epoch()  # starts workers, warms caches
    return epoch


def spdl_epoch(files: list[Path], threads: int) -> tuple[Callable[[], float] | None, str]:
    from bench_jpeg import spdl_candidate  # noqa: PLC0415

    _, fn, status = spdl_candidate()
    if fn is None:
        return None, status
    pool = ThreadPoolExecutor(threads)

    def epoch() -> float:
        start = time.perf_counter()
        list(pool.map(fn, files))
        return time.perf_counter() - start

    try:
        epoch()
    except Exception as exc:  # imports but cannot decode here
        return None, f"cannot run: {type(exc).__name__}: {str(exc)[:200]}"
    return epoch, "ok"


def op_alone(files: list[Path], clock: Callable[[], float] = time.thread_time) -> Callable[[], float]:
    """Seconds of decode_jpeg_crop alone over ``files`` (bytes and boxes ready beforehand), by ``clock``.

    ``time.thread_time`` (CPU) for the entropy-floor ratio (CPU against CPU); ``time.perf_counter`` (wall, one
    thread) for the 85% target, which compares with the loaders' wall-clock images/s: both measured the same
    way, in the same rounds, under the same load.
    """
    from fastpipe.datasets.crop import crop_params

    datas = [fjpeg.read_bytes(f) for f in files]
    boxes = [crop_params(*fjpeg.jpeg_size(d)) for d in datas]
    flips = [i % 2 == 0 for i in range(len(files))]

    def run() -> float:
        start = clock()
        for data, box, flip in zip(datas, boxes, flips):
            fjpeg.decode_jpeg_crop(data, box, (SIZE, SIZE), hflip=flip)
        return clock() - start

    return run


def prepared_variants(files: list[Path]) -> tuple[dict[str, Callable[[], float]], int]:
    """Thread CPU of decode-and-crop on the progressive files among ``files``: as they are, after ``fastpipe prepare``
    (baseline from the same coefficients), and after it with a restart marker every MCU row; the same boxes for all."""
    from fastpipe.datasets.crop import crop_params
    from fastpipe.datasets.prepare import to_baseline
    from fastpipe.ops.jpeg import is_progressive

    progressive = [d for d in (fjpeg.read_bytes(f) for f in files) if is_progressive(d)]
    if not progressive or not fjpeg.JPEG_OP_AVAILABLE:
        return {}, 0
    boxes = [crop_params(*fjpeg.jpeg_size(d)) for d in progressive]
    versions = {
        "progressive files as they are": progressive,
        "progressive files after prepare": [to_baseline(d) for d in progressive],
        "the same + restart marker every MCU row": [to_baseline(d, restart_rows=1) for d in progressive],
    }

    def timer(datas: list[torch.Tensor]) -> Callable[[], float]:
        def run() -> float:
            start = time.thread_time()
            for data, box in zip(datas, boxes):
                fjpeg.decode_jpeg_crop(data, box, (SIZE, SIZE))
            return (time.thread_time() - start) * len(files) / len(datas)  # scaled: ms per image comes out per progressive file

        return run

    return {name: timer(datas) for name, datas in versions.items()}, len(progressive)


OP_WALL = "op alone (1 thread, wall)"


def limits_line(rate: float, ideal: float, ms: dict[str, float], loader_cpu_ms: float | None, load: tuple[float, ...]) -> str:
    """What keeps the 2-thread loader from 2 / (the op's wall time per image): its own work around the op, or cores.

    ``loader_cpu_ms``: the loader's CPU per image (all threads). Cores it used = rate x CPU per image; what the op
    needs is its thread-CPU time per image, the rest is the loader's own (reads, draws, hand-over, Python).
    """
    text = f"85% target: thread loader (2 threads) {rate:.0f} images/s against 2 / op wall = {ideal:.0f} ({rate / ideal:.2f})"
    if loader_cpu_ms is None:
        return text + f"; the loader's CPU was not measured; load average {load[0]:.1f} on {os.cpu_count()} cores"
    op_cpu = ms["op alone (1 thread)"]
    cores = rate * loader_cpu_ms / 1e3
    return (
        text + f"; limits: the loader spent {loader_cpu_ms:.3f} ms CPU per image against the op's {op_cpu:.3f} "
        f"({100 * (loader_cpu_ms - op_cpu) / loader_cpu_ms:.0f}% of its CPU around the op) and kept {cores:.2f} of 2 cores busy "
        f"(the rest: waiting, or other processes: load average {load[0]:.1f} on {os.cpu_count()} cores); "
        f"the op alone ran at {op_cpu / ms[OP_WALL]:.2f} of a core on one thread (wall against CPU)"
    )


def per_sample(fn: Callable[[Path], Any], files: list[Path]) -> Callable[[], float]:
    def run() -> float:
        start = time.thread_time()
        for f in files:
            fn(f)
        return time.thread_time() - start

    return run


def pss_of(kind: str, files: list[Path], batch: int) -> tuple[float | None, str, float | None]:
    """MiB of PSS summed over the process running loader ``kind`` and its children, at the end of one epoch; the status;
    and the MiB added since the same process had imported everything but built no loader."""
    if not Path("/proc/self/smaps_rollup").exists():
        return None, "no /proc/<pid>/smaps_rollup on this system", None
    listing = Path(os.environ.get("TMPDIR", "/tmp")) / f"thread_loaders_files_{os.getpid()}.json"
    listing.write_text(json.dumps([str(f) for f in files]))
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--pss", kind, "--files", str(listing), "--batch", str(batch)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])},
        )
    finally:
        listing.unlink(missing_ok=True)
    if done.returncode != 0:
        return None, f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}", None
    before, total = (float(v) for v in done.stdout.strip().splitlines()[-1].split())
    return total, "ok", total - before


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        path = task / "children"
        if path.exists():
            found += [int(c) for c in path.read_text().split()]
    return found + [g for c in found for g in _children(c)]


def _pss_child(kind: str, files: list[Path], batch: int) -> None:
    """Runs in the fresh process: one epoch of ``kind``, then print the PSS (MiB) of this process and its children."""
    torch.set_num_threads(1)
    import torchvision.transforms.v2  # noqa: F401  (every kind's imports, before the baseline)

    import fastpipe.datasets  # noqa: F401

    before = _pss_kib(os.getpid()) / 1024
    loader = make_loader(kind, files, batch)
    iterator = iter(loader)
    held = None
    for held in iterator:  # noqa: B007  (the last batch stays alive, as in a training loop)
        pass
    pids = [os.getpid(), *_children(os.getpid())]
    print(before, sum(_pss_kib(p) for p in pids) / 1024)


def thread_section(files: list[Path], rounds: int, batch: int, memory: bool = True) -> tuple[list[str], list[tuple[str, float, str]], dict]:
    """Runs the section; returns (markdown lines, targets as (name, ratio, verdict), JSON payload)."""
    from bench_jpeg import NOT_MEASURED, RESIZE_KERNEL, dali_epoch, main_candidates, with_resize_kernel  # noqa: PLC0415

    torch.set_num_threads(1)
    loaders: dict[str, Callable[[], float]] = {}
    status: dict[str, str] = {}
    names = {
        "thread-loader-1": "thread-loader (1 thread)",
        "thread-loader-2": "thread-loader (2 threads)",
        "dataloader-fastpipe": "dataloader+fastpipe (2 workers)",
        "torchvision-v2": "torchvision-v2 (2 workers)",
    }
    for kind, name in names.items():
        loaders[name] = epoch_of(make_loader(kind, files, batch))
    for name, (fn, why) in (("dali-cpu (2 threads)", dali_epoch(files, 2, batch)), ("spdl (2 threads)", spdl_epoch(files, 2))):
        status[name] = why
        if fn is not None:
            loaders[name] = fn
    candidates = main_candidates()
    single = {
        "op alone (1 thread)": op_alone(files),
        OP_WALL: op_alone(files, time.perf_counter),
        "fastpipe sample (1 thread)": per_sample(candidates["fastpipe"][1], files),
    }
    if "entropy-floor" in candidates:
        single["entropy floor (1 thread)"] = per_sample(candidates["entropy-floor"][1], files)
    for candidate, name in (
        ("fastpipe-portable-resize", "fastpipe sample, portable resize (1 thread)"),
        ("fastpipe-no-resize", "fastpipe sample, resize skipped (1 thread)"),
    ):
        if candidate in candidates:  # the same sample path with the op's resize kernel forced for the pass (issue 25, item 3)
            single[name] = with_resize_kernel(RESIZE_KERNEL[candidate], per_sample(candidates[candidate][1], files))
    prepared, n_progressive = prepared_variants(files)
    single.update(prepared)
    for fn in single.values():
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in [*loaders, *single]}
    order = list(seconds)
    shuffler = random.Random(1)
    for r in range(rounds):
        shuffler.shuffle(order)
        for name in order:
            seconds[name].append((loaders.get(name) or single[name])())
        print(f"  thread section round {r + 1}/{rounds}", flush=True)
    rate = {name: statistics.median(len(files) / s for s in seconds[name]) for name in loaders}
    cpu_ms = {
        name: statistics.median(c * 1e3 / len(files) for c in fn.cpu[1:]) for name, fn in loaders.items() if len(getattr(fn, "cpu", [])) > 1
    }
    ms = {name: statistics.median(s * 1e3 / len(files) for s in seconds[name]) for name in single}
    pss = {kind: pss_of(kind, files, batch) if memory else (None, "not measured (--no-memory)", None) for kind in [*names, FORKSERVER]}

    lines = [
        f"Thread loader section (issue 25): {len(files)} files, batch {batch}, {rounds} rounds, one epoch per loader per round, "
        f"{os.cpu_count()} cores; images/s median (spread); PSS of the loader's processes after one epoch, each in a fresh process.",
        "",
        "| loader | images/s (median) | spread | x dataloader+fastpipe | CPU ms per image (all its processes) | PSS MiB (all processes) | of which the loader added |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    base = rate.get(names["dataloader-fastpipe"], float("nan"))
    for name in [*names.values(), "dali-cpu (2 threads)", "spdl (2 threads)"]:
        if name not in rate:
            lines.append(f"| {name} | {status.get(name, 'not run')} | | | | | |")
            continue
        spread = [len(files) / s for s in seconds[name]]
        kind = next((k for k, v in names.items() if v == name), None)
        mem = pss[kind] if kind else (None, "not measured for this peer", None)
        mem_text = f"{mem[0]:.0f} | {mem[2]:.0f}" if mem[0] is not None else f"{mem[1]} |"
        cpu = f"{cpu_ms[name]:.3f}" if name in cpu_ms else ""
        lines.append(f"| {name} | {rate[name]:.0f} | {min(spread):.0f}-{max(spread):.0f} | {rate[name] / base:.2f} | {cpu} | {mem_text} |")
    load = os.getloadavg()
    lines += [
        "",
        f"Load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) on {os.cpu_count()} cores at the end: images/s are wall-clock "
        "figures and fall with other processes' load; CPU ms per image is what each loader spent (the main process's threads "
        "and its worker processes, warm-up epoch left out) and is not a target.",
    ]
    lines += ["", "One thread, thread CPU (wall where marked), ms per image: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()), ""]

    targets: list[tuple[str, float, str]] = []

    def add(name: str, value: float, goal: float, at_most: bool = False) -> None:
        ok = value <= goal if at_most else value >= goal
        targets.append((name, value, "PASS" if ok else f"FAIL (goal {'<=' if at_most else '>='} {goal:g}x)"))

    two = rate[names["thread-loader-2"]]
    add("images/s: thread loader (2 threads) / DataLoader+fastpipe ImageFolder (2 workers) >= 1.35x", two / base, 1.35)
    if "dali-cpu (2 threads)" in rate:
        add("images/s: thread loader (2 threads) / DALI CPU (2 threads) >= 2x", two / rate["dali-cpu (2 threads)"], 2)
    else:
        targets.append(
            (
                "images/s: thread loader (2 threads) / DALI CPU (2 threads) >= 2x",
                float("nan"),
                f"{NOT_MEASURED}: DALI CPU {status['dali-cpu (2 threads)']}",
            )
        )
    ideal = 2 / (ms[OP_WALL] / 1e3)  # wall against wall, same rounds
    add("images/s: thread loader (2 threads) / (2 / op's wall time per image, one thread) >= 0.85", two / ideal, 0.85)
    lines += [limits_line(two, ideal, ms, cpu_ms.get(names["thread-loader-2"]), load), ""]
    thread_pss, loader_pss = pss["thread-loader-2"][0], pss["dataloader-fastpipe"][0]
    if thread_pss is not None and loader_pss is not None:
        add("PSS: thread loader (2 threads) / DataLoader (2 workers) <= 0.5", thread_pss / loader_pss, 0.5, at_most=True)
    else:
        targets.append(
            ("PSS: thread loader (2 threads) / DataLoader (2 workers) <= 0.5", float("nan"), f"{NOT_MEASURED}: {pss['thread-loader-2'][1]}")
        )
    if thread_pss is not None and loader_pss is not None and pss["dataloader-fastpipe"][2]:
        lines.append(
            f"PSS the loaders added (not a target): thread loader (2 threads) / DataLoader (2 workers) "
            f"{pss['thread-loader-2'][2] / pss['dataloader-fastpipe'][2]:.2f}x"
        )
        lines.append("")
    spawned = pss[FORKSERVER]
    if thread_pss is not None and spawned[0] is not None:
        lines += [
            f"PSS with the DataLoader's workers started by forkserver (Python 3.14's default on Linux; not a target: this "
            f"Python, {sys.version_info.major}.{sys.version_info.minor}, forks them): {spawned[0]:.0f} MiB in all, of which "
            f"{spawned[2]:.0f} added; thread loader (2 threads) / this DataLoader {thread_pss / spawned[0]:.2f}x. Forked workers "
            "share the parent's torch pages; started fresh, each imports torch itself.",
            "",
        ]
    elif memory:
        lines += [f"PSS with forkserver-started workers: {spawned[1]}", ""]
    if prepared:
        before, after = ms["progressive files as they are"], ms["progressive files after prepare"]
        add(f"cost: progressive files ({n_progressive}) before / after fastpipe prepare >= 2.5x", before / after, 2.5)
        restart = ms["the same + restart marker every MCU row"]
        lines += [
            f"Restart markers (not a target; off by default): after prepare {after:.3f} ms per image, with a marker every MCU row "
            f"{restart:.3f} ({after / restart:.2f}x: {'a gain' if restart < after else 'no gain: keep them off'})",
            "",
        ]
    if "entropy floor (1 thread)" in ms:
        add(
            "cost: fastpipe sample / entropy floor <= 1.3x",
            ms["fastpipe sample (1 thread)"] / ms["entropy floor (1 thread)"],
            1.3,
            at_most=True,
        )
    payload = {
        "images_per_s": rate,
        "rounds_s": seconds,
        "single_thread_ms": ms,
        "cpu_ms_per_image": cpu_ms,
        "load_average": os.getloadavg(),
        "pss_mib": {k: v[0] for k, v in pss.items()},
        "pss_added_mib": {k: v[2] for k, v in pss.items()},
        "status": status,
        "targets": [{"target": t, "measured": v if v == v else None, "verdict": verdict} for t, v, verdict in targets],
    }
    return lines, targets, payload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the thread-loader section alone, or one loader's PSS (--pss KIND)")
    parser.add_argument("--pss", choices=KINDS)
    parser.add_argument("--files", help="a JSON list of paths (with --pss)")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    if args.pss:
        _pss_child(args.pss, [Path(p) for p in json.loads(Path(args.files).read_text())], args.batch)
        return 0
    print("run it through bench_jpeg.py: python benchmarks/bench_jpeg.py --thread-loader-only", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
