"""Facts about the machine that several modules need."""
from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (respects affinity masks and containers, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
