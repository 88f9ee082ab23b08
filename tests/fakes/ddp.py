"""Two-rank diagnoses on the gloo backend, run by tests/diagnosis/runtime/test_ddp.py in spawned processes, and the free
port their rendezvous takes (the stream checks' ranks take one too)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
from pathlib import Path

import torch.distributed as dist
import torchvision.transforms as T
from torch.utils.data import DataLoader, DistributedSampler

from tests.fakes import Fast, PlantedDataset, Raise, Slow

SLOW_MS = 40
#: Collectives that do not match across ranks fail after this long instead of hanging the test.
GROUP_TIMEOUT = datetime.timedelta(seconds=60)


def free_port() -> int:
    """A TCP port free on this machine now, for the ranks' rendezvous (``tcp://127.0.0.1:PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world_size: int, port: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT)


def diagnose_rank(rank: int, world_size: int, port: int, out: str) -> None:
    from fastpipe import diagnose
    from tests.fakes import quick_options

    _init(rank, world_size, port)
    try:
        # rank 1 is the slow one: its planted stage costs twice rank 0's
        dataset = PlantedDataset(length=4000, transform=T.Compose([Fast(), Slow(SLOW_MS * (1 + rank))]))  # no epoch ends mid-point
        loader = DataLoader(dataset, batch_size=4, num_workers=1, sampler=DistributedSampler(dataset, shuffle=True, seed=3))
        options = quick_options(steps=4, warmup=1, budget=1.5, threshold=0.15, stage_costs=False)
        report = diagnose(loader, lambda batch: None, device="sim:10", options=options)
        Path(out, f"rank{rank}.json").write_text(report.to_json())
        dist.barrier()
    finally:
        dist.destroy_process_group()


class Meddling(PlantedDataset):
    """Changes its transform's output before returning it (``.clone()``), so no point inside the pipeline can be served."""

    def __getitem__(self, index: int):
        x, y = super().__getitem__(index)
        return x.clone(), y


def _loader(rank: int, dataset_kind: type, stages: list) -> DataLoader:
    dataset = dataset_kind(length=4000, transform=T.Compose(stages))
    return DataLoader(dataset, batch_size=4, num_workers=1, sampler=DistributedSampler(dataset, shuffle=False))


def measure_points_rank(rank: int, world_size: int, port: int, out: str) -> None:
    """The middle points, measured as a diagnosis measures them (dropping one that fails), where rank 1's dataset
    cannot serve them and rank 0's can. Writes each rank's plan: its points and the reasons for what it dropped."""
    from fastpipe.devices import parse_device
    from fastpipe.diagnosis._diagnose import _Diagnosis
    from fastpipe.diagnosis._options import MeasureOptions
    from fastpipe.diagnosis.ladder._points import PointRunner
    from fastpipe.workloads._workload import Workload

    _init(rank, world_size, port)
    try:
        workload = Workload(
            loader=_loader(rank, Meddling if rank == 1 else PlantedDataset, [Fast(), Slow(5)]), step=lambda batch: None, name="ddp"
        )
        options = MeasureOptions(steps=2, warmup=1, budget=0.5, precision=0.5, worker_timeout=60)
        runner = PointRunner(workload, parse_device("sim:10"), options)
        diagnosis = _Diagnosis(runner, workload, 0.15, "linear", None)
        measured = {point: diagnosis.measure(point) is not None for point in ("raw", "after:Fast")}
        runner.close()
        plan = {"measured": measured, "points": runner.plan.points, "unavailable": [dataclasses.asdict(u) for u in runner.plan.unavailable]}
        Path(out, f"rank{rank}.json").write_text(json.dumps(plan, default=str))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def diagnose_rank_failing_baseline(rank: int, world_size: int, port: int, out: str) -> None:
    """A stage raises on rank 1 alone, so its baseline fails. Each rank writes its report or its error."""
    from fastpipe import diagnose
    from fastpipe.errors import PipelineError
    from tests.fakes import quick_options

    _init(rank, world_size, port)
    try:
        stages = [Fast(), Slow(5)] + ([Raise("rank 1's file is corrupt")] if rank == 1 else [])
        try:
            report = diagnose(
                _loader(rank, PlantedDataset, stages),
                lambda batch: None,
                device="sim:10",
                options=quick_options(steps=2, warmup=1, budget=0.5, threshold=0.15, stage_costs=False),
            )
            result = {"report": json.loads(report.to_json())}
        except PipelineError as exc:
            result = {"error": str(exc), "stage": exc.stage}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
