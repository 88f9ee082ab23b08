"""A controlled neighbour for issue 32: another job sharing the cores while ``fastpipe diagnose`` runs.

    .venv/bin/python benchmarks/neighbour_job.py training [--seconds 600]
    .venv/bin/python benchmarks/neighbour_job.py busy [--seconds 600]

``training``: a plain training script with its own 2 DataLoader workers (random images made and augmented in the
workers, a small CNN trained on the CPU in the main process with one intra-op thread): the realistic neighbour,
whose processes block and wake all the time (queues, pipes, shared memory). ``busy``: two pure-CPU busy loops, the
neighbour the run-queue clock already explains. Both stop after ``--seconds`` or when killed; each prints one line
when it is running, so a caller can wait for it (:func:`start`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
READY = "neighbour running"


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def busy(seconds: float) -> None:
    """Two processes that only burn CPU."""
    procs = [multiprocessing.Process(target=_spin, args=(seconds,), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    print(READY, flush=True)
    for p in procs:
        p.join()


def training(seconds: float) -> None:
    """A small CNN trained on random images loaded by 2 DataLoader workers (flip and normalise in the workers)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    class Images(Dataset):
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, index: int) -> Any:
            x = torch.randint(0, 256, (3, 96, 96), dtype=torch.uint8).float().div_(255)
            if index % 2:
                x = x.flip(-1)
            return (x - 0.5) / 0.25, index % 10

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Images(), batch_size=32, num_workers=2, prefetch_factor=2)
    end = time.monotonic() + seconds
    print(READY, flush=True)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if time.monotonic() > end:
            break


def start(kind: str, seconds: float = 600.0) -> subprocess.Popen:
    """Start a neighbour of ``kind`` (``training`` or ``busy``) in its own process group; returns once it runs."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), kind, "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if READY not in line:
        proc.kill()
        raise RuntimeError(f"the {kind} neighbour did not start (it printed {line!r})")
    if kind == "training":
        time.sleep(2.0)  # its workers start and its loop reaches its steady pace
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Stop a neighbour from :func:`start` and its children (its own process group only)."""
    import os
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("training", "busy"))
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    (training if args.kind == "training" else busy)(args.seconds)


if __name__ == "__main__":
    main()
