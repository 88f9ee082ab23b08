"""The planted start-up case: a dataset object that carries a large list (about 150 MB pickled), a worker_init_fn
that takes 0.5 s, and 2 non-persistent workers started by forkserver (spawn's cost without re-importing torch in
every worker: the fork server imports it once, as ``multiprocessing.set_forkserver_preload`` arranges in a real job).

    cd benchmarks && python -m fastpipe diagnose startup_planted:make_workload --device sim:50 --no-memory

(``benchmarks/startup_fixes.py planted`` measures each fix's saving by applying it.)
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch.utils.data import DataLoader  # noqa: E402

from tests.fakes import PlantedDataset  # noqa: E402

INIT_S = 0.5
RECORDS = int(os.environ.get("RECORDS", "150000"))
START_METHOD = os.environ.get("START_METHOD", "forkserver")


def slow_init(worker_id: int) -> None:
    time.sleep(INIT_S)


class Carries(PlantedDataset):
    """A dataset object that carries a large list (an index of records kept in Python)."""

    def __init__(self, records: int = RECORDS, length: int = 4000) -> None:
        super().__init__(length=length)
        self.records = [b"r" * 1000 + i.to_bytes(4, "little") for i in range(records)] if records else []


def make_loader(records: int = RECORDS, start_method: str = START_METHOD) -> DataLoader:
    if start_method == "forkserver":
        multiprocessing.set_forkserver_preload(["__main__", "torch", "tests.fakes", __name__])
    return DataLoader(Carries(records), batch_size=8, num_workers=2, worker_init_fn=slow_init, multiprocessing_context=start_method)


def make_workload(device: Any = None) -> tuple[DataLoader, Any]:
    return make_loader(), lambda batch: None
