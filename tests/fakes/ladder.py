"""Planted ladders: cache points' results written by hand, and a runner that hands them to the real diagnosis.

Why here: the attribution and verdict tests (``tests/diagnosis/verdict/``) share these builders; a test module
imports them from this package, never from another test module.
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

from fastpipe.diagnosis._diagnose import run_diagnosis
from fastpipe.diagnosis.ladder._plan import make_plan
from fastpipe.diagnosis.ladder._points import PointRunner
from fastpipe.diagnosis.ladder._results import ExperimentResult
from fastpipe.diagnosis.verdict._report import Report
from fastpipe.workloads._workload import Workload
from tests.fakes import quick_options


# ----- results by hand, for the rules of _attribute (no measuring) ---------------------------------
def ladder_result(point: str, ms: float, noise: float = 0.01) -> ExperimentResult:
    """A point's result measured at ``ms`` a step with a relative noise of ``noise``."""
    return ExperimentResult(
        name=point,
        cache_point=point,
        steps_per_s=1000 / ms,
        fraction_of_bound=float("nan"),
        spread=0.0,
        noise=noise,
        cpu_util=0.5,
        system_cpu_util=0.5,
    )


def plan_and_results(ms: dict[str, float], copy_ms: float = 0.0):
    """The plan of a three-stage pipeline (A, B, C) and a result for each point of ``ms`` ({point: ms a step}); the
    points from ``after:`` down carry a worker copy of ``copy_ms`` a sample."""
    from fastpipe.stages import Stage, TransformPipeline

    pipeline = TransformPipeline((), "transform", [Stage("A", lambda x: x), Stage("B", lambda x: x), Stage("C", lambda x: x)])
    plan = make_plan(pipeline, None)
    results = {p: ladder_result(p, v) for p, v in ms.items()}
    for p, r in results.items():
        if p.startswith("after:") or p == "raw":
            r.copy_ms_per_sample = copy_ms
    return plan, results


# ----- a whole diagnosis on planted figures -----------------------------------------------------------
class A:
    def __call__(self, x: Any) -> Any:
        return x


class B(A):
    pass


class Tiny(Dataset):
    """Eight small tensors through two custom stages (A, B): the ladder's points are device, host, sample, after:B,
    after:A... as for any two-stage transform; the planted runner never reads them."""

    def __init__(self) -> None:
        self.transform = T.Compose([A(), B()])

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return self.transform(torch.zeros(4)), 0


class PlantedRunner(PointRunner):
    """Measures nothing: each point's result is the planted (ms per step, relative standard error, other processes'
    share of the CPU); every remeasurement gives the same figures (a neighbour's load that does not go away)."""

    planted: dict[str, tuple[float, float, float]] = {}

    def measure(self, point: str, *, budget_s: float | None = None) -> ExperimentResult:
        ms, noise, others = self.planted[point]
        result = ExperimentResult(
            name=point,
            cache_point=point,
            steps_per_s=1000.0 / ms,
            fraction_of_bound=float("nan"),
            spread=noise * 3,
            noise=noise,
            cpu_util=0.3,
            system_cpu_util=0.3 + others,
            steps_measured=40,
        )
        self.results[point] = result
        return result

    def close(self) -> None:
        self.progress.close()


def planted_report(
    points: dict[str, tuple[float, float, float]], device: str = "sim:100", prefetch_depth: int = 0, **options: Any
) -> Report:
    """The report of a diagnosis whose points measured ``points`` ({point: (ms, rel. standard error, others' CPU)});
    ``prefetch_depth``: the workload's (how deep its loop prefetches to the device)."""
    runner = type("Runner", (PlantedRunner,), {"planted": points})
    loader = DataLoader(Tiny(), batch_size=4, num_workers=0)
    workload = Workload(loader=loader, step=lambda batch: None, prefetch_depth=prefetch_depth)
    return run_diagnosis(
        workload, device, quick_options(**{"steps": 4, "warmup": 0, "pool": 1, "stage_costs": False, **options}), runner=runner
    )
