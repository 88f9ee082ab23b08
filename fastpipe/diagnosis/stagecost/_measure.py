"""The stage-cost pass: :func:`measure_stage_costs` runs the user's own loop over a timed loader.

Part of :mod:`fastpipe.diagnosis.stagecost`. It drives the worker-side timing of
:mod:`fastpipe.diagnosis.stagecost._timing` through a short run of the workload (optionally between two
untimed passes, to check that timing perturbs nothing), and turns the batches' timings into a
:class:`~fastpipe.diagnosis.stagecost._result.StageCosts`. Two of its helpers, :func:`coerce_workload` and
:func:`round_noise`, are also used by :mod:`fastpipe.experiments._tune`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe._system import usable_cores
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._cache import CachePointDataset
from fastpipe.diagnosis.ladder._cachepoint import BASELINE
from fastpipe.diagnosis.ladder._cpu import CpuMonitor
from fastpipe.diagnosis.ladder._measure import Measurement, device_batches, measure_steps
from fastpipe.diagnosis.ladder._noise import rel_stderr
from fastpipe.diagnosis.ladder._points import pipeline_error
from fastpipe.diagnosis.runtime._snapshot import preserve_user_state
from fastpipe.diagnosis.stagecost._result import StageCost, StageCosts
from fastpipe.diagnosis.stagecost._timing import (
    COLLATE_STAGE,
    OVERHEAD_STAGE,
    BatchTimings,
    TimedCollate,
    TimedDataset,
    _Tap,
    timed_loader,
    untimed_loader,
)
from fastpipe.errors import ConfigError, FastpipeError, PipelineError
from fastpipe.stages import RAW_STAGE
from fastpipe.workloads._workload import Workload, loader_batch_size, unwrapped_workload


# ----- the pass -----------------------------------------------------------------------------
def coerce_workload(source: "DataLoader | Workload", step: Callable[[Any], Any] | None = None, name: str | None = None) -> Workload:
    """A Workload from a Workload or a (DataLoader, step) pair, as :func:`fastpipe.diagnose` accepts them."""
    if isinstance(source, Workload):
        return unwrapped_workload(source if step is None else dataclasses.replace(source, step=step), source.name)
    if step is None or not callable(step):
        raise ConfigError("pass step, a function step(batch) that runs one training step (or a Workload)")
    # a wrapped loader (timm's PrefetchLoader, accelerate's, fastpipe's prefetcher) is unwrapped; anything else is refused
    workload = unwrapped_workload(Workload(loader=source, step=step, name=name or "workload"), name or "the loader")
    if not isinstance(workload.loader, DataLoader):
        raise ConfigError(f"expected a torch.utils.data.DataLoader or a fastpipe.Workload, not {type(workload.loader).__name__}")
    return workload


class _Noop:
    def __call__(self, x: Any) -> Any:
        return x


class _ProbeDataset(Dataset):
    """Free samples through ``stages`` no-op transforms: whatever reading it costs is fastpipe's own."""

    def __init__(self, stages: int) -> None:
        from torchvision.transforms import Compose

        self.transform = Compose([_Noop() for _ in range(stages)])
        self.sample = torch.zeros(4)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.transform(self.sample)


def timing_cost_us(stages: int, *, samples: int = 400, batch: int = 8, repeats: int = 3) -> float:
    """CPU microseconds per sample that timing adds to a pipeline of ``stages`` transforms.

    Measured in this process on a pipeline that costs nothing, read as a diagnosis reads it
    (stages labelled, untimed) and as the stage-cost pass reads it (timed, labelled, collate
    wrapped); the best of ``repeats`` of each. A busy machine cannot inflate this the way it
    inflates an A/B comparison of throughput, since both sides run back to back on one thread.
    """
    from torch.utils.data import default_collate

    probe = _ProbeDataset(stages)
    pipeline, _ = find_pipeline(probe)
    untimed, timed, collate = CachePointDataset(probe, pipeline, BASELINE), TimedDataset(probe, pipeline), TimedCollate(default_collate)

    def cost(read: Callable[[int], Any], gather: Callable[[list[Any]], Any]) -> float:
        best = math.inf
        for _ in range(repeats):
            began = time.thread_time()
            for start in range(0, samples, batch):
                gather([read(i) for i in range(start, start + batch)])
            best = min(best, time.thread_time() - began)
        return best

    extra = cost(timed.__getitem__, collate) - cost(untimed.__getitem__, default_collate)
    return max(0.0, 1e6 * extra / samples)


def _stage_order(pipeline_names: list[str], seen: set[str]) -> list[str]:
    order = [RAW_STAGE, *pipeline_names, COLLATE_STAGE]
    return order + sorted(seen - set(order) - {OVERHEAD_STAGE}) + ([OVERHEAD_STAGE] if OVERHEAD_STAGE in seen else [])


def _blocked(wall: float, cpu: float, runq: float, others: float) -> tuple[float, float]:
    """(blocked, the most of it other threads can have taken) in one window: blocked is wall less CPU less run queue;
    the process's other threads can have held the stage's thread (the GIL, a lock) at most for as long as they ran
    or waited for a core (:class:`~fastpipe.diagnosis.stagecost._timing._Clocks`)."""
    blocked = max(0.0, wall - cpu - runq)
    return blocked, min(blocked, max(0.0, others))


def _noise(per_batch: list[float]) -> float:
    """Two standard errors of a per-sample figure over the batches (0 with fewer than 2 batches)."""
    n = len(per_batch)
    if n < 2:
        return 0.0
    mean = sum(per_batch) / n
    return 2.0 * math.sqrt(sum((x - mean) ** 2 for x in per_batch) / (n - 1) / n)


def summarize(records: list[BatchTimings], names: list[str], num_workers: int) -> tuple[list[StageCost], int]:
    """Per-sample stage costs from the batches' timings; also the number of samples they cover.

    A stage's blocked time (wall less CPU less run queue) is its own wait, or time another thread of its process
    held it (the feeder thread pickling the previous batch with the GIL), which shows only as those threads running
    meanwhile. Other threads also run *beside* a stage that sleeps, so the two cannot be told apart inside a stage
    that blocks by itself: a stage whose blocked time beyond all the other threads did is above its noise (two
    standard errors over the batches) blocks by itself and keeps all of it. Otherwise what the other threads did is
    not its own: it is taken off its wall time and charged to
    :data:`~fastpipe.diagnosis.stagecost._timing.OVERHEAD_STAGE`, so the rows still sum to the workers' busy time.
    """
    samples = sum(r.samples for r in records)
    if samples == 0:
        raise PipelineError("the stage-cost pass timed no samples: the loader delivered no batches", stage=None)
    totals: dict[str, list[float]] = {}  # wall, CPU, run queue, blocked, of it at most held, switches (vol, invol)
    beyond: dict[str, list[float]] = {}  # blocked beyond what other threads did, per batch, per sample
    for record in records:
        for name, (w, c, *rest) in record.stages.items():
            q, o, voluntary, involuntary = (rest + [0.0] * 4)[:4]
            blocked, held = _blocked(w, c, q, o)
            entry = totals.setdefault(name, [0.0] * 7)
            for i, v in enumerate((w, c, q, blocked, held, voluntary, involuntary)):
                entry[i] += v
            if record.samples:
                beyond.setdefault(name, []).append((blocked - held) / record.samples)
    noise = {name: _noise(values) for name, values in beyond.items()}
    for name, entry in totals.items():
        if name == OVERHEAD_STAGE or (entry[3] - entry[4]) / samples > noise.get(name, 0.0):
            entry[4] = 0.0  # blocks by itself (or is the overhead row): nothing here is another thread's
    held_elsewhere = sum(v[4] for v in totals.values())
    if held_elsewhere > 0:
        totals.setdefault(OVERHEAD_STAGE, [0.0] * 7)
    wall = {name: v[0] - v[4] + (held_elsewhere if name == OVERHEAD_STAGE else 0.0) for name, v in totals.items()}
    total_wall, total_cpu = sum(wall.values()), sum(v[1] for v in totals.values())
    parallelism = max(1, num_workers)
    stages = []
    for name in _stage_order(names, set(totals)):
        w, (_, c, q, blocked, held, voluntary, involuntary) = wall.get(name, 0.0) / samples, totals.get(name, [0.0] * 7)
        kind = {RAW_STAGE: RAW_STAGE, COLLATE_STAGE: COLLATE_STAGE, OVERHEAD_STAGE: "overhead"}.get(name, "transform")
        stages.append(
            StageCost(
                name=name,
                kind=kind,
                ms_per_sample=1000 * w,
                cpu_ms_per_sample=1000 * c / samples,
                runq_ms_per_sample=1000 * q / samples,
                share=w * samples / total_wall if total_wall > 0 else 0.0,
                cpu_share=c / total_cpu if total_cpu > 0 else math.nan,
                samples_per_s_alone=parallelism / w if w > 0 else math.inf,
                held_ms_per_sample=1000 * (held_elsewhere if name == OVERHEAD_STAGE else held) / samples,
                blocked_ms_per_sample=1000 * (blocked - held) / samples,
                blocked_noise_ms=1000 * noise.get(name, 0.0),
                voluntary_switches=voluntary / samples,
                involuntary_switches=involuntary / samples,
            )
        )
    return stages, samples


def round_noise(step_times: list[float], workers: int) -> float:
    """Relative standard error of the mean step time over whole rounds of ``workers`` steps (:func:`fastpipe.diagnosis.ladder._noise.rel_stderr`)."""
    return rel_stderr(step_times, workers)


@dataclass
class _Pass:
    measurement: Measurement
    worker_cpu_s: float
    samples: int
    """Samples the loop consumed while ``worker_cpu_s`` was counted."""


def _run_pass(workload: Workload, device: Device, loader: Any, steps: int, warmup: int, tap: _Tap | None = None) -> _Pass:
    """The workload's own loop over ``loader`` (a DataLoader or a timing tap), timed after warm-up."""
    children = CpuMonitor()
    batches = device_batches(dataclasses.replace(workload, loader=loader), device)

    def on_step(i: int) -> None:
        if i == warmup - 1:
            if tap is not None:
                tap.mark()
            children.start()

    def run_step(batch: Any) -> None:
        try:
            device.run_step(workload.step, batch)
        except Exception as exc:
            raise PipelineError(f"the training step raised {type(exc).__name__}: {exc}", stage="step") from exc

    if warmup == 0:
        children.start()
    try:
        measurement = measure_steps(lambda: next(batches), run_step, warmup=warmup, steps=steps, device=device, on_step=on_step)
    except (FastpipeError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise pipeline_error(exc, "the stage-cost pass" if tap is not None else "the untimed pass") from exc
    finally:
        children.stop()
        batches.close()
    # in steady state the workers produce what the loop consumes, so the window's samples are the steps' samples
    # (timings themselves arrive a batch or two ahead of their step, through the pin thread)
    batch_size = loader_batch_size(workload.loader)
    samples = steps * batch_size if batch_size else sum(r.samples for r in (tap.measured() if tap is not None else []))
    return _Pass(measurement, children.children_seconds, samples)


def _worker_cpu_ms(passes: list[_Pass], workers: int) -> float | None:
    seconds, samples = sum(p.worker_cpu_s for p in passes), sum(p.samples for p in passes)
    return 1000 * seconds / samples if workers > 0 and samples and seconds > 0 else None


def measure_stage_costs(
    source: "DataLoader | Workload",
    device: "str | Device | None" = None,
    *,
    step: Callable[[Any], Any] | None = None,
    steps: int = 10,
    warmup: int = 3,
    check_overhead: bool = False,
    tolerance: float = 0.05,
    worker_timeout: float = 300.0,
    name: str | None = None,
) -> StageCosts:
    """Time each stage inside the workers during a short run of the user's own loop.

    Args:
        source: a :class:`~fastpipe.Workload`, or a DataLoader with ``step``.
        device: ``cuda[:N]``, ``cpu``, ``sim:STEP_MS`` or a Device (default: cuda if present, else sim:290).
        steps, warmup: measured and untimed steps; steps round up to whole rounds of workers, as a diagnosis does.
        check_overhead: also run the loop untimed (the diagnosis's baseline) before and after the timed pass, so
            :attr:`StageCosts.overhead_within_noise` says whether timing perturbed throughput; running it on both
            sides lets drift of a busy machine show as noise instead of as overhead.
        tolerance: the smallest relative throughput difference the overhead check counts, besides noise.
        worker_timeout: seconds a worker may take for a batch, used when the loader sets no timeout.

    Raises:
        ConfigError: bad arguments.
        PipelineError: a stage, collate or the step raised; ``.stage`` says which.
    """
    workload = coerce_workload(source, step, name)
    if steps < 1 or warmup < 0:
        raise ConfigError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance is a fraction of the throughput, e.g. 0.05; got {tolerance}")
    device = parse_device(device)
    loader = workload.loader
    workers = loader.num_workers
    steps = max(1, workers) * math.ceil(steps / max(1, workers))
    pipeline, _ = find_pipeline(loader.dataset)
    untimed: list[_Pass] = []
    timed, notes = timed_loader(loader, timeout=worker_timeout)
    tap = _Tap(timed)
    with preserve_user_state(workload.model, workload.optimizer, loader, schedulers=workload.schedulers, scaler=workload.scaler):
        if check_overhead:
            untimed.append(_run_pass(workload, device, untimed_loader(loader, timeout=worker_timeout), steps, warmup))
        result = _run_pass(workload, device, tap, steps, warmup, tap)
        if check_overhead:
            untimed.append(_run_pass(workload, device, untimed_loader(loader, timeout=worker_timeout), steps, warmup))
    stages, samples = summarize(tap.measured(), pipeline.names() if pipeline is not None else [], workers)
    if workers == 0:
        notes.append("num_workers=0: the stages ran in the training process, between steps")
    untimed_times = [t for p in untimed for t in p.measurement.step_times]
    return StageCosts(
        workload=workload.name,
        device=device.spec,
        num_workers=workers,
        batch_size=loader_batch_size(loader),
        cores=usable_cores(),
        steps=steps,
        warmup=warmup,
        stages=stages,
        samples=samples,
        steps_per_s=result.measurement.steps_per_s,
        noise=round_noise(result.measurement.step_times, workers),
        cpu_util=result.measurement.cpu_util,
        system_cpu_util=result.measurement.system_cpu_util,
        os_worker_cpu_ms_per_sample=_worker_cpu_ms([result], workers),
        untimed_steps_per_s=len(untimed_times) / sum(untimed_times) if untimed_times else None,
        untimed_noise=round_noise(untimed_times, workers) if untimed_times else None,
        untimed_passes=[p.measurement.steps_per_s for p in untimed],
        untimed_os_worker_cpu_ms_per_sample=_worker_cpu_ms(untimed, workers),
        tolerance=tolerance,
        notes=notes,
        timing_us_per_sample=timing_cost_us(len(pipeline.stages) if pipeline is not None else 0),
    )
