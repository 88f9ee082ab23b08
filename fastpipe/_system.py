"""Facts about the machine that several modules need: how many CPUs this process may really use.

``os.cpu_count()`` is the host's count. A process may be held to fewer by its affinity mask
(``taskset``, Slurm) or by its container's CPU quota (Docker ``--cpus``, Kubernetes limits),
which the kernel enforces through cgroups: v2's ``cpu.max`` (``"QUOTA PERIOD"`` or
``"max PERIOD"``) or v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: no quota). A quota
set on any ancestor cgroup applies too, so the smallest along the path counts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(mount: Path, relative: str) -> list[Path]:
    """The cgroup directory of this process under ``mount`` and each parent up to the mount itself.

    Inside a container with its own cgroup namespace the recorded path may not exist under the
    mount (the container sees its own cgroup as the root): then the mount alone is read.
    """
    leaf = mount / relative.strip("/")
    if not leaf.is_dir():
        return [mount]
    dirs = [leaf]
    while dirs[-1] != mount and mount in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def _v2_limit(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_limit(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = float(quota or "-1"), float(period or "0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_limit(cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = PROC_SELF_CGROUP) -> float | None:
    """CPUs this process's cgroups allow (quota / period, the smallest along the path), or None when unlimited or unknown.

    Args:
        cgroup_root: where cgroups are mounted (tests pass a fake tree).
        self_cgroup: the process's cgroup membership file (``/proc/self/cgroup`` format).
    """
    root = Path(cgroup_root)
    text = _read(Path(self_cgroup)) or "0::/"
    limits: list[float] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, relative = parts
        if hierarchy == "0" and not controllers:  # cgroup v2 (unified), mounted at the root or at root/unified (hybrid)
            for mount in (root, root / "unified"):
                if (mount / "cgroup.controllers").exists() or (mount / "cpu.max").exists():
                    limits += [x for x in (_v2_limit(d) for d in _ancestors(mount, relative)) if x is not None]
        elif "cpu" in controllers.split(","):  # cgroup v1, the cpu controller mounted alone or with cpuacct
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                mount = root / name
                if mount.is_dir():
                    limits += [x for x in (_v1_limit(d) for d in _ancestors(mount, relative)) if x is not None]
                    break
    return min(limits) if limits else None


def usable_cpus(cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = PROC_SELF_CGROUP) -> float:
    """CPUs this process may use: the smallest of its affinity mask, its cgroup quota and ``os.cpu_count()``.

    A quota may be fractional (``--cpus 1.5``); see :func:`usable_cores` for a whole number.
    """
    counts: list[float] = [float(os.cpu_count() or 1)]
    try:
        counts.append(float(len(os.sched_getaffinity(0))))
    except AttributeError:  # not on Linux
        pass
    quota = cgroup_cpu_limit(cgroup_root, self_cgroup)
    if quota is not None:
        counts.append(quota)
    return min(counts)


def usable_cores(cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = PROC_SELF_CGROUP) -> int:
    """Whole cores this process may keep busy: :func:`usable_cpus` rounded down (a 1.5-CPU quota is 1), at least 1.

    Rounded down because a worker per partial core would be throttled by the quota.
    """
    return max(1, math.floor(usable_cpus(cgroup_root, self_cgroup) + 1e-9))
