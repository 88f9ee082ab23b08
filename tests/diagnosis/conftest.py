"""Fixtures of the script-mode tests (``test_script*.py``): a run that leaves nothing behind, and one intra-op thread.

Why a conftest: several test modules use them (by argument or ``pytest.mark.usefixtures``), and a test module does
not import another. ``test_script_budget.py`` defines its own ``one_thread`` (it only puts back the count the script
sets), which takes precedence there.
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader


def _shm() -> set[str]:
    """Shared-memory files this process's tensors or fastpipe left (torch names its files torch_<pid>_...); other
    developers' processes on this machine create and remove theirs at any time."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if n.startswith((f"torch_{os.getpid()}_", "fastpipe"))}


def _ours(process: psutil.Process) -> bool:
    """A child the run left: alive, and not multiprocessing's resource tracker (started by the first spawn, kept by
    design until this process exits)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE and not any("resource_tracker" in part for part in process.cmdline())
    except psutil.NoSuchProcess:
        return False


def _left_running(timeout: float = 10.0) -> list[psutil.Process]:
    """This process's children still alive after ``timeout`` (workers are reaped a moment after they are told to stop)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if _ours(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture
def clean():
    """The run leaves no process, no thread of fastpipe's, no /dev/shm entry and the DataLoader untapped."""
    before = _shm()
    # threads an earlier test left (a probe thread outlives its timeout by design) are not this run's
    earlier = {id(t) for t in threading.enumerate()}
    yield
    assert DataLoader.__iter__.__qualname__ == "DataLoader.__iter__"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("fastpipe") and id(t) not in earlier]
    assert not _left_running()
    assert _shm() - before == set()


@pytest.fixture
def one_thread():
    """One intra-op thread for the script's CPU step, as OMP_NUM_THREADS=1 gives: on 2 shared cores, torch's default
    of one thread a core fights the loader's workers and the other processes, and a tiny step takes 100s of ms."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
