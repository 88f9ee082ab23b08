"""The training process as a stage: the loader's work that runs there, not in the workers.

A DataLoader's workers load and collate; the training process itself draws every index from the sampler (in
``_next_data``, between two ``next()`` calls, on the loop's own thread), collates and loads when
``num_workers=0``, and pins each batch in a thread of its own when ``pin_memory=True`` (a thread that takes the
GIL the loop needs). None of this is a worker stage: the ladder sees it in the span between the host point
(batches cached, no loader) and the sample point (the user's loader, sampler and collate, samples cached), which it
calls collate/IPC. Each part is timed here on its own, in the training process, outside the timed steps:

* the sampler: a copy of it iterated for at most :data:`SAMPLER_BUDGET_S` (the first index apart: a per-epoch setup);
* collate, only without workers: the loader's ``collate_fn`` on one batch of real samples, repeated;
* pinning, only where a device pins (CUDA): ``pin_memory`` of one collated batch, repeated; elsewhere the DataLoader
  does not pin (torch warns and skips it), so there is nothing to time and the part says so.

The loop's own host work between ``next()`` and the step is the user's code: a factory's diagnosis runs its own loop
and cannot time it; script mode times it in the script's loop (:mod:`._loop_work`) and adds it here as the part
:data:`LOOP_WORK`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, IterableDataset

LOOP_WORK = "loop work before the model"
"""The part script mode adds: the script's loop's own work on each batch before its model runs (:mod:`._loop_work`)."""
#: Seconds each part is timed for at most.
SAMPLER_BUDGET_S = 0.5
PART_BUDGET_S = 0.3
MAX_REPEATS = 50

SAMPLER_FIX = """import numpy as np
from torch.utils.data import Sampler

class PrecomputedSampler(Sampler):
    \"\"\"The same order, computed once per epoch with array operations; __iter__ then only hands indices out.\"\"\"

    def __init__(self, weights, num_samples, seed=0):
        self.weights, self.num_samples, self.seed, self.epoch = np.asarray(weights, dtype=np.float64), num_samples, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.choice(len(self.weights), self.num_samples, p=self.weights / self.weights.sum())  # one call
        return iter(order.tolist())"""


@dataclass
class MainPart:
    """One part of the loader's work in the training process."""

    name: str
    """``"sampler"``, ``"collate"``, ``"pinning"`` (the loader's), or :data:`LOOP_WORK` (the script's loop's)."""
    ms_per_step: float | None
    """Its time per batch (per step), None when it was not timed (``skipped`` says why)."""
    detail: str = ""
    skipped: str | None = None

    def advice(self, workers: int) -> str:
        """The fix that fits this part."""
        if self.name == "sampler":
            return (
                "The sampler runs in the training process, on the loop's thread, for every index of every batch: compute "
                "the epoch's order once in __iter__ (array operations, e.g. numpy choice or torch.multinomial over all "
                "indices), then hand the indices out; per-index work on the samples belongs in the dataset (the workers)."
            )
        if self.name == LOOP_WORK:
            return (
                "The script's loop does this on every batch on the training thread, after next() and before its model, "
                "where nothing overlaps it: move per-sample work into the dataset's transforms (the workers run it ahead of "
                "the step, in parallel), whole-batch work (mixup, cutmix, normalisation) onto the device after the copy "
                "(torchvision.transforms.v2 on the device tensor, or fastpipe's device transforms), and copy pinned batches "
                "with .to(device, non_blocking=True) so the copy does not hold the loop."
            )
        if self.name == "collate":
            return (
                "With num_workers=0 the training process loads and collates every batch between steps: set num_workers > 0 "
                "(collate then runs in the workers), or make collate_fn cheaper (stack preallocated tensors, no per-sample Python)."
            )
        return (
            "pin_memory=True pins every batch in a thread of the training process, which competes with the loop for the "
            "GIL: fastpipe.loading.recycled(loader) pins each buffer once, or set pin_memory=False and copy with "
            f"fastpipe.DevicePrefetcher{'' if workers else ' (and num_workers > 0)'}."
        )


@dataclass
class MainProcess:
    """The loader's work in the training process, part by part (see the module docstring)."""

    workers: int
    batch_size: int | None
    parts: list[MainPart] = field(default_factory=list)
    seconds: float = 0.0
    named: str | None = None
    """The loader's part the verdict named as a stage (:mod:`fastpipe.diagnosis.verdict._main_process`), if any."""
    loop_named: bool = False
    """The loop's own work (:data:`LOOP_WORK`, script mode) was named as a stage."""
    device_step_ms: float | None = None
    """The device step, to size each part against (set with the verdict)."""

    def part(self, name: str) -> MainPart | None:
        return next((p for p in self.parts if p.name == name), None)

    def largest(self) -> MainPart | None:
        """The largest of the loader's parts (the loop's own work is no part of the ladder's collate/IPC span)."""
        timed = [p for p in self.parts if p.ms_per_step is not None and p.name != LOOP_WORK]
        return max(timed, key=lambda p: p.ms_per_step or 0.0, default=None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report's main-process section."""
        named, device_step_ms = self.named, self.device_step_ms
        out = ["Main process (the loader's work in the training process, timed there apart from the steps):"]
        for p in self.parts:
            if p.ms_per_step is None:
                out.append(f"  - {p.name}: not timed ({p.skipped})")
                continue
            share = f", {p.ms_per_step / device_step_ms:.0%} of the device step" if device_step_ms else ""
            mark = " [named: it costs the step]" if p.name == named or (p.name == LOOP_WORK and self.loop_named) else ""
            out.append(f"  - {p.name}: {p.ms_per_step:.1f} ms per step{share}{'; ' + p.detail if p.detail else ''}{mark}")
        loop = (
            "the loop's own work timed in the script's steps"
            if self.part(LOOP_WORK)
            else "the loop's own host work between next() and the step is the user's code, not run here (script mode times it)"
        )
        out.append(f"  (timed in {self.seconds:.1f} s; {loop})")
        return out

    def markdown_lines(self) -> list[str]:
        lines = self.lines()
        return [
            "",
            f"#### {lines[0].rstrip(':')}",
            "",
            *(f"- {line[4:]}" if line.startswith("  - ") else line.strip() for line in lines[1:]),
        ]


def _timed(call: Callable[[], Any], budget_s: float) -> tuple[float, int]:
    """(mean seconds per call, calls) over repeated calls for at most ``budget_s`` (at least one call)."""
    start = time.perf_counter()
    calls = 0
    while True:
        call()
        calls += 1
        if time.perf_counter() - start >= budget_s or calls >= MAX_REPEATS:
            return (time.perf_counter() - start) / calls, calls


def _sampler_part(loader: DataLoader) -> tuple[MainPart, list[int] | None]:
    """The sampler's time per batch (and one batch of its indices, for collate)."""
    batched = loader.batch_sampler is not None
    source = loader.batch_sampler if batched else loader.sampler
    memo = {id(loader.dataset): loader.dataset}
    try:
        sampler = copy.deepcopy(source, memo)
    except Exception:  # an unpicklable member: iterate a shallow copy (its own iterator state is fresh each __iter__)
        sampler = copy.copy(source)
    start = time.perf_counter()
    iterator = iter(sampler)
    try:
        first = next(iterator)
    except StopIteration:
        return MainPart("sampler", None, skipped="the sampler is empty"), None
    setup_s = time.perf_counter() - start
    batches, indices, began = 0, 0, time.perf_counter()
    for batch in iterator:
        batches += 1
        indices += len(batch) if batched else 1
        if time.perf_counter() - began >= SAMPLER_BUDGET_S or batches >= 4 * MAX_REPEATS:
            break
    elapsed = time.perf_counter() - began
    if batches == 0:  # one batch in all: its time includes the setup
        batches, indices, elapsed = 1, len(first) if batched else 1, setup_s
    per_batch_ms = 1000 * elapsed / batches
    per_index_ms = 1000 * elapsed / max(1, indices)
    detail = f"{per_index_ms:.2f} ms per index over {indices} indices; its first index took {1000 * setup_s:.1f} ms (per-epoch setup)"
    return MainPart("sampler", per_batch_ms, detail), list(first) if batched else [first]


def _collate_part(loader: DataLoader, indices: list[int] | None) -> tuple[MainPart, Any]:
    if loader.num_workers > 0:
        return MainPart("collate", None, skipped="it runs in the workers (num_workers > 0): the ladder's collate/IPC span"), None
    if isinstance(loader.dataset, IterableDataset):
        return MainPart("collate", None, skipped="a stream's batches are collated as it is read (the ladder's spans time it)"), None
    if indices is None or loader.batch_sampler is None:
        return MainPart("collate", None, skipped="the loader does not batch (batch_size=None)"), None
    samples = [loader.dataset[i] for i in indices]
    collate = loader.collate_fn
    seconds, calls = _timed(lambda: collate(samples), PART_BUDGET_S)
    batch = collate(samples)
    return MainPart("collate", 1000 * seconds, f"collate_fn on {len(samples)} samples, {calls} times"), batch


def _pinning_part(loader: DataLoader, batch: Any) -> MainPart:
    if not loader.pin_memory:
        return MainPart("pinning", None, skipped="pin_memory is off")
    if not torch.cuda.is_available():
        return MainPart("pinning", None, skipped="no CUDA here: the DataLoader does not pin (torch skips it), so there is nothing to time")
    from torch.utils.data._utils.pin_memory import pin_memory

    if batch is None:
        return MainPart("pinning", None, skipped="no batch was collated here (workers collate): rerun with the batch's shape known")
    seconds, calls = _timed(lambda: pin_memory(batch), PART_BUDGET_S)
    return MainPart("pinning", 1000 * seconds, f"pin_memory on one batch, {calls} times (the pin thread's work per batch)")


def measure_main_process(loader: Any) -> MainProcess | None:
    """Time the loader's work in the training process (module docstring); None for a loader that is no DataLoader.

    Never advances the user's sampler (a copy is iterated) and never changes the user's dataset.
    """
    if not isinstance(loader, DataLoader):
        return None
    start = time.perf_counter()
    batch_size = loader.batch_size
    result = MainProcess(workers=loader.num_workers, batch_size=batch_size)
    if isinstance(loader.dataset, IterableDataset):
        result.parts.append(MainPart("sampler", None, skipped="a stream orders itself, in its workers"))
        indices = None
    else:
        sampler, indices = _sampler_part(loader)
        result.parts.append(sampler)
    collate, batch = _collate_part(loader, indices)
    if batch is None and loader.pin_memory and torch.cuda.is_available() and indices is not None:
        batch = loader.collate_fn([loader.dataset[i] for i in indices])  # the pinning part needs one collated batch
    result.parts += [collate, _pinning_part(loader, batch)]
    result.seconds = time.perf_counter() - start
    return result
