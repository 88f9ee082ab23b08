"""DDP under torchrun, reproduced with two spawned ranks on gloo and a sim device: one plan, no hang, one report."""
from __future__ import annotations

import json
import socket

import pytest
import torch.multiprocessing as mp

from tests.ddp_fixtures import SLOW_MS, diagnose_rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(240)
def test_two_ranks_follow_one_plan_and_report_the_slowest(tmp_path) -> None:
    mp.spawn(diagnose_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # one plan: the same points measured, the same stages named, on both ranks
    points = [[e["cache_point"] for e in r["experiments"]] for r in reports]
    assert points[0] == points[1]
    assert [b["stage"] for b in reports[0]["bottlenecks"]] == [b["stage"] for b in reports[1]["bottlenecks"]] == ["Slow"]
    # the slowest rank stands for each point: rank 1's Slow costs 2 x 40 ms x 4 samples / 1 worker = 320 ms a step
    slow = reports[0]["bottlenecks"][0]
    assert slow["added_ms"] == pytest.approx(2 * SLOW_MS * 4, rel=0.25)
    note = next(n for n in reports[0]["notes"] if n.startswith("DDP with 2 ranks"))
    assert "slowest rank 1" in note
