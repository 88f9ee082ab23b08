"""Stage costs measured inside the DataLoader workers: the raw load, each transform, and collate.

Caching (:mod:`fastpipe.diagnosis`) says how much *throughput* a stage costs the whole pipeline;
it cannot say where the workers' CPU time goes, and so cannot settle whether a stage is slow
or merely tipped a saturated CPU over. This module answers the second question in its own
short pass over the user's pipeline:

* :class:`TimedDataset` wraps the dataset (never modifying it). In each worker it runs a copy
  of the dataset whose transform is a copy of its :class:`~fastpipe.stages.TransformPipeline`
  with every stage clocked around its own call. Every window (a sample, the transform, each
  stage) is read with all clocks at both ends: wall, the thread's CPU, its run-queue time
  (Linux schedstat), the other threads' CPU and run-queue time, and the thread's context
  switches, and a reading that a switch interrupted is taken again (issue 32: reading the CPU
  clock can preempt the thread inside the reading). The raw load is what is left of
  ``__getitem__`` once the transform is taken out; the transform's time beyond its stages (the
  harness) and the time other threads of the worker held a stage (the feeder thread pickling
  the previous batch with the GIL) are the ``worker overhead`` row, charged to no stage.
* :class:`TimedCollate` wraps the loader's ``collate_fn``, times it, and ships the batch's
  timings back *with the batch*: it returns ``(batch, BatchTimings)``, and the main process
  strips the timings off before pinning, copying and the step see the batch. No queue, no
  extra process, a few hundred bytes per batch.
* Each stage carries a ``torch.profiler.record_function`` label (``fastpipe/raw load``,
  ``fastpipe/<Stage>``, ``fastpipe/collate``), so it shows in a profiler trace of a worker or
  of a ``num_workers=0`` loader. The raw-load range encloses the transform ranges: its *self*
  time is the raw load.

Two independent references check the accounting: the per-sample worker time implied by the
measured throughput (``num_workers x wall time / samples``, equal to the workers' busy time
when the pipeline is input-bound), and the workers' CPU time as the OS counts it (psutil).
Optional untimed passes, before and after the timed one, check that timing perturbs neither
throughput (beyond noise) nor the workers' CPU per sample.

The package is split by job: :mod:`~fastpipe.diagnosis.stagecost._timing` (inside the workers, and the
loaders built on that), :mod:`~fastpipe.diagnosis.stagecost._result` (:class:`StageCosts` and its
renderings), :mod:`~fastpipe.diagnosis.stagecost._measure` (the pass itself). What a diagnosis
concludes from these costs when the CPU is saturated is the verdict's (:mod:`~fastpipe.diagnosis.verdict._saturation`).
Every name below is re-exported so ``from fastpipe.diagnosis.stagecost import X`` keeps working.
"""

from fastpipe.diagnosis.stagecost._measure import coerce_workload, measure_stage_costs, round_noise, summarize, timing_cost_us
from fastpipe.diagnosis.stagecost._result import SCHEMA, StageCost, StageCosts
from fastpipe.diagnosis.stagecost._timing import (
    COLLATE_LABEL,
    COLLATE_STAGE,
    OVERHEAD_STAGE,
    RAW_LABEL,
    BatchTimings,
    TimedCollate,
    TimedDataset,
    TimedIterableDataset,
    _Ledger,
    loader_with,
    timed_loader,
    untimed_loader,
)

__all__ = [
    "BatchTimings",
    "COLLATE_LABEL",
    "COLLATE_STAGE",
    "OVERHEAD_STAGE",
    "RAW_LABEL",
    "SCHEMA",
    "StageCost",
    "StageCosts",
    "TimedCollate",
    "TimedDataset",
    "TimedIterableDataset",
    "_Ledger",
    "coerce_workload",
    "loader_with",
    "measure_stage_costs",
    "round_noise",
    "summarize",
    "timed_loader",
    "timing_cost_us",
    "untimed_loader",
]
