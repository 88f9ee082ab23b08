"""Usable CPUs (fastpipe._system): affinity, cgroup v1 and v2 quotas, read from fake cgroup trees."""

from __future__ import annotations

import os
from pathlib import Path

from fastpipe._system import cgroup_cpu_limit, usable_cores, usable_cpus


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def host_cpus() -> int:
    return min(os.cpu_count() or 1, len(os.sched_getaffinity(0)))


def test_v2_quota_is_read_and_max_means_unlimited(tmp_path: Path) -> None:
    proc = tmp_path / "proc_cgroup"
    write(tmp_path, "proc_cgroup", "0::/")
    root = tmp_path / "cg"
    write(root, "cgroup.controllers", "cpu memory")
    write(root, "cpu.max", "max 100000")
    assert cgroup_cpu_limit(root, proc) is None and usable_cpus(root, proc) == host_cpus()
    write(root, "cpu.max", "50000 100000")
    assert cgroup_cpu_limit(root, proc) == 0.5 and usable_cores(root, proc) == 1


def test_v2_smallest_quota_along_the_path_counts(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc_cgroup"
    write(tmp_path, "proc_cgroup", "0::/kubepods/pod1/container")
    write(root, "cgroup.controllers", "cpu")
    write(root, "kubepods/cpu.max", "max 100000")
    write(root, "kubepods/pod1/cpu.max", "150000 100000")
    write(root, "kubepods/pod1/container/cpu.max", "max 100000")
    assert cgroup_cpu_limit(root, proc) == 1.5
    assert usable_cpus(root, proc) == min(1.5, host_cpus()) and usable_cores(root, proc) == 1


def test_v2_in_a_namespace_reads_the_mount(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc_cgroup"
    write(tmp_path, "proc_cgroup", "0::/docker/abc")  # a path the container cannot see
    write(root, "cgroup.controllers", "cpu")
    write(root, "cpu.max", "400000 100000")
    assert cgroup_cpu_limit(root, proc) == 4.0


def test_v1_quota_and_unlimited(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc_cgroup"
    write(tmp_path, "proc_cgroup", "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n0::/")
    write(root, "cpu,cpuacct/cpu.cfs_quota_us", "-1")
    write(root, "cpu,cpuacct/cpu.cfs_period_us", "100000")
    write(root, "cpu,cpuacct/docker/x/cpu.cfs_quota_us", "-1")
    write(root, "cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_limit(root, proc) is None
    write(root, "cpu,cpuacct/docker/x/cpu.cfs_quota_us", "100000")
    assert cgroup_cpu_limit(root, proc) == 1.0 and usable_cores(root, proc) == 1


def test_v1_cpu_mounted_alone(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc_cgroup"
    write(tmp_path, "proc_cgroup", "1:cpu:/\n2:cpuacct:/")
    write(root, "cpu/cpu.cfs_quota_us", "25000")
    write(root, "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_limit(root, proc) == 0.25 and usable_cores(root, proc) == 1


def test_no_cgroup_files_fall_back_to_affinity(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None
    assert usable_cores(tmp_path / "none", tmp_path / "missing") == host_cpus()


def test_this_machine() -> None:
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
