"""RayLoader: a DataLoader-shaped loader whose samples are made by Ray Data tasks on any node of a cluster.

The article's fix for a pipeline no single host can feed is to add CPUs on other machines. Ray
Data already schedules CPU work across a cluster and streams the results back, so fastpipe builds
on it rather than on a home-made server:

* each epoch, the driver draws the batches' indices from the sampler (so shuffling, custom
  samplers and ``drop_last`` behave as in the DataLoader) and hands Ray one row per batch;
* a Ray task per batch reads ``dataset[i]`` for each index (the raw load plus the CPU transforms),
  collates with the loader's ``collate_fn`` and returns the tensors as columns (uint8 stays uint8);
* the trainer receives each batch from Ray's object store without a copy (``torch.from_numpy`` on
  Arrow's buffer), pinned in a Ray prefetch thread when the device wants pinned memory.

The loader has the DataLoader attributes fastpipe's measurement, prefetcher and diagnosis read
(``dataset``, ``batch_size``, ``pin_memory``, ``num_workers``, ``len()``), so it works with
:class:`~fastpipe.loading._prefetch.DevicePrefetcher` and device-side transforms unchanged, and
:meth:`RayLoader.with_dataset` is the hook the diagnosis uses to serve a cache point from the tasks.

Why tasks and not an actor pool: Ray Data restarts an actor pool for every execution, and every
epoch is one. On this project's 2-core machine that cost ~8 s per epoch (new processes importing
torch), against ~0.2 s for tasks, whose worker processes Ray keeps warm. The one thing actors give,
building the dataset once per process, the tasks get from :mod:`fastpipe.distributed.worker`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
import warnings
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate

from fastpipe._system import usable_cores
from fastpipe._tree import map_tensors
from fastpipe.devices import Device, parse_device
from fastpipe.distributed import cluster
from fastpipe.distributed._ray import require_ray, require_ray_torch
from fastpipe.distributed.stats import RayStats, collect_stats
from fastpipe.distributed.worker import ERROR_PREFIX, SPEC_COLUMN, load_batches
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.stages import StageError

#: Cache points a diagnosis can serve through a Ray loader (see :meth:`RayLoader.with_dataset`).
SUPPORTED_CACHE_POINTS = ("device", "host", "sample", "baseline")
#: Why the other points (``after:<stage>``, ``raw``) are not offered on Ray.
UNSUPPORTED_POINT_REASON = (
    "stages run inside Ray tasks, so the raw load and each transform cannot be cached apart there; "
    "diagnose the same dataset with a local DataLoader to split them"
)


class RayLoader:
    """Batches of a map-style dataset, made by Ray Data tasks and streamed to the trainer.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``); it is pickled to the cluster.
        batch_size, shuffle, sampler, batch_sampler, drop_last, collate_fn, generator: as in DataLoader.
        pin_memory: pin batches for a fast, non-blocking copy; done only when the device can use it.
        device: the device batches go to, used to pin the way it wants (``cuda``, or ``sim``'s modelled
            pinned memory). Without one, batches are pinned only when CUDA is present, as DataLoader does.
        num_cpus: CPUs the data tasks use in total, across nodes (default: all the cluster's, or of
            ``nodes``). For a local cluster fastpipe starts, also the cluster's size.
        cpus_per_task: CPUs Ray reserves for each batch's task.
        nodes: restrict the tasks to N nodes (the driver's first) or to named nodes (Ray node IDs or IPs).
        address: an existing cluster (``"auto"``, ``"HEAD_IP:6379"``, ``"ray://HEAD_IP:10001"``). ``None``
            uses the Ray connection this process already has, or starts a local cluster that fastpipe
            then stops on :meth:`close`, on a pipeline error and on Ctrl-C.
        object_store_memory: bytes of object store for a local cluster fastpipe starts.
        prefetch_batches: batches Ray fetches (and pins) ahead of the trainer, in its own threads.
        preserve_order: deliver batches in sampler order (as DataLoader does) instead of as they finish.
        max_task_retries: times Ray reruns a batch's task whose worker process died (a lost node, a
            segfault, the OOM killer) before the epoch fails. Ray's own default is to retry forever,
            which turns a deterministic crash into a hang. Exceptions raised by the dataset are never retried.

    The dataset is shipped once per Ray worker process and kept there, like a DataLoader worker's
    copy; changes made to it afterwards are not seen by the tasks. Batch tensors that are not
    pinned live in Ray's object store: treat them as read-only, as Ray's own loaders do.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        *,
        shuffle: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        generator: torch.Generator | None = None,
        pin_memory: bool = False,
        device: "Device | str | None" = None,
        num_cpus: float | None = None,
        cpus_per_task: float = 1.0,
        nodes: int | Sequence[str] | None = None,
        address: str | None = None,
        object_store_memory: int | None = None,
        prefetch_batches: int = 2,
        preserve_order: bool = False,
        max_task_retries: int = 2,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(
                f"RayLoader needs a map-style dataset (with __getitem__ and __len__), not {type(dataset).__name__}: "
                "Ray tasks read samples by index; for an IterableDataset, build a ray.data.Dataset from its source instead"
            )
        if num_cpus is not None and not num_cpus > 0:
            raise ConfigError(f"num_cpus must be positive (CPUs for the data tasks), got {num_cpus}")
        if not cpus_per_task > 0:
            raise ConfigError(f"cpus_per_task must be positive, got {cpus_per_task}")
        if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
            raise ConfigError(f"prefetch_batches must be a whole number >= 0, got {prefetch_batches!r}")
        if isinstance(max_task_retries, bool) or not isinstance(max_task_retries, int) or max_task_retries < 0:
            raise ConfigError(f"max_task_retries must be a whole number >= 0, got {max_task_retries!r}")
        if batch_sampler is None:
            if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
                raise ConfigError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
            if sampler is None:
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
            elif shuffle:
                raise ConfigError("pass either sampler or shuffle=True, not both (as with DataLoader)")
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.generator = generator
        self.pin_memory = bool(pin_memory)
        self.device = parse_device(device) if device is not None else None
        self.address = address
        self.nodes = nodes
        self.object_store_memory = object_store_memory
        self.prefetch_batches = prefetch_batches
        self.preserve_order = preserve_order
        self.cpus_per_task = float(cpus_per_task)
        self.max_task_retries = max_task_retries
        self._num_cpus = num_cpus
        self.label = "loader"
        #: ``Dataset.stats()`` of the last epoch that ran, raw and parsed (see :mod:`fastpipe.distributed.stats`).
        self.last_stats: RayStats | None = None
        #: Every epoch's stats, shared with the loaders :meth:`with_dataset` makes, for the report.
        self.stats_history: list[RayStats] = []
        self._token = uuid.uuid4().hex
        self._put: tuple[Any, Any] | None = None  # (cluster session, ObjectRef of the dataset)
        self._epochs: "weakref.WeakSet[RayEpoch]" = weakref.WeakSet()

    # ----- construction -----------------------------------------------------------------
    @classmethod
    def from_dataloader(cls, loader: DataLoader, **options: Any) -> "RayLoader":
        """The same pipeline as ``loader`` (dataset, sampler, batching, collate, pinning), fed by Ray tasks.

        ``options`` are RayLoader's own (``num_cpus``, ``nodes``, ``address``, ``device``...). ``num_cpus``
        defaults to the loader's ``num_workers``, so the comparison with the DataLoader is like for like.
        """
        if not isinstance(loader, DataLoader):
            raise ConfigError(f"from_dataloader needs a torch.utils.data.DataLoader, not {type(loader).__name__}")
        if loader.batch_sampler is None:
            raise ConfigError("the DataLoader has batch_size=None (no batching); give it a batch_size for Ray to batch by")
        if loader.worker_init_fn is not None:
            raise ConfigError(
                "the DataLoader has a worker_init_fn, which Ray tasks would not call: they are not DataLoader workers "
                "(torch.utils.data.get_worker_info() is None there). Move that set-up into the dataset, done lazily on first use"
            )
        options.setdefault("pin_memory", loader.pin_memory)
        options.setdefault("num_cpus", loader.num_workers or None)
        return cls(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn, generator=loader.generator, **options)

    def with_dataset(self, dataset: Any, *, label: str | None = None) -> "RayLoader":
        """A copy that reads ``dataset`` instead, every other setting kept: the diagnosis's cache-point hook.

        Mirrors :func:`fastpipe.loading._rebuild.rebuild_loader` for DataLoaders. The copy shares this loader's
        cluster, sampler and ``stats_history``; ``label`` (default: the wrapper's cache point, e.g.
        ``"sample"``) names its epochs in the report. Since each Ray worker process keeps its own copy
        of the dataset, a wrapper that caches a finished sample (the ``sample`` point) caches one per
        worker process, as it does per DataLoader worker.
        """
        clone = copy.copy(self)
        clone.dataset = dataset
        clone.label = label or str(getattr(dataset, "point", None) or ("loader" if dataset is self.dataset else type(dataset).__name__))
        clone.last_stats = None
        clone._token = uuid.uuid4().hex
        clone._put = None
        clone._epochs = weakref.WeakSet()
        return clone

    # ----- DataLoader-like attributes ----------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> bool:
        return bool(getattr(self.batch_sampler, "drop_last", False))

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def num_workers(self) -> int:
        """CPUs the Ray tasks may use at once (what the report shows where a DataLoader has its workers).

        Known without a cluster when ``num_cpus`` is given or fastpipe will start a local one;
        otherwise read from the cluster, connecting to it if need be.
        """
        if self.nodes is None:
            if self._num_cpus is not None:
                return max(1, int(self._num_cpus))
            if self.address is None and not os.environ.get("RAY_ADDRESS") and not _ray_running():
                return usable_cores()  # the local cluster fastpipe will start
        return max(1, int(self._cpus(self._connect())))

    @property
    def unsupported_point_reason(self) -> str:
        return UNSUPPORTED_POINT_REASON

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __repr__(self) -> str:
        where = self.address or ("this process's Ray connection" if _ray_running() else "a local cluster")
        return f"<RayLoader {type(self.dataset).__name__} batch_size={self.batch_size} num_cpus={self._num_cpus} on {where}>"

    # ----- epochs -----------------------------------------------------------------------
    def __iter__(self) -> "RayEpoch":
        epoch = RayEpoch(self)
        self._epochs.add(epoch)
        return epoch

    def close(self) -> None:
        """End live epochs, and stop the cluster if fastpipe started it (a later epoch starts a new one)."""
        for epoch in list(self._epochs):
            epoch.close()
        cluster.shutdown_owned()

    def __enter__(self) -> "RayLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connect(self) -> cluster.ClusterInfo:
        cluster.ensure_cluster(self.address, self._num_cpus, self.object_store_memory)
        return cluster.cluster_info(self.nodes)

    def _cpus(self, info: cluster.ClusterInfo) -> float:
        return info.cpus if self._num_cpus is None else min(float(self._num_cpus), info.cpus)

    def _dataset_ref(self, ray: Any) -> Any:
        """The dataset in the object store, put once per cluster session (a restarted cluster lost it)."""
        session = _session_key(ray)
        if self._put is None or self._put[0] != session:
            self._put = (session, ray.put(self.dataset))
        return self._put[1]

    def _pin_fn(self) -> Callable[[Any], Any] | None:
        if not self.pin_memory:
            return None
        if self.device is not None:
            return self.device.pin if self.device.kind in ("cuda", "sim") else None
        if torch.cuda.is_available():
            return lambda batch: map_tensors(lambda t: t if t.is_pinned() else t.pin_memory(), batch)
        return None  # as DataLoader: no accelerator, no pinning (fastpipe's measurement models it for sim)

    def _start_epoch(self) -> tuple[Any, Iterator[Any]]:
        """Build this epoch's Ray dataset and start streaming it: (dataset, iterator of _Collated)."""
        ray = require_ray_torch()
        info = self._connect()
        tasks = max(1, int(self._cpus(info) // self.cpus_per_task))
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        rows = [
            {"batch": number, "seed": base_seed, "indices": np.asarray(list(indices), dtype=np.int64)}
            for number, indices in enumerate(self.batch_sampler)
        ]
        if not rows:
            return None, iter(())
        with _data_context(ray, preserve_order=self.preserve_order):
            dataset = ray.data.from_items(rows, override_num_blocks=len(rows))  # one block, hence one task, per batch
            dataset = _map_batches(
                dataset,
                load_batches,
                batch_size=1,
                fn_kwargs={"token": self._token, "dataset": self._dataset_ref(ray), "collate_fn": self.collate_fn},
                num_cpus=self.cpus_per_task,
                compute=ray.data.TaskPoolStrategy(size=tasks),
                label_selector=cluster.node_label_selector(info.node_ids),
                zero_copy_batch=True,
                max_retries=self.max_task_retries,
            )
        batches = dataset.iter_torch_batches(
            batch_size=None,  # each block is one batch already: no re-batching copy
            collate_fn=_collate_class()(self._pin_fn(), self.batch_size),
            prefetch_batches=self.prefetch_batches,
            device="cpu",
        )
        return dataset, iter(batches)


class RayEpoch(Iterator[Any]):
    """One epoch of a :class:`RayLoader`. ``close()`` stops Ray's execution; errors become PipelineError.

    On a pipeline error or Ctrl-C the cluster is shut down if fastpipe started it.
    """

    def __init__(self, owner: RayLoader) -> None:
        self._owner = owner
        self._dataset: Any = None
        self._source: Iterator[Any] | None = None
        self._ready: list[Any] = []
        self._closed = False
        self.batches = 0
        try:
            self._dataset, self._source = owner._start_epoch()
        except (KeyboardInterrupt, ConfigError, PipelineError, ImportError):
            self._fail()
            raise
        except Exception as exc:
            self._fail()
            raise as_pipeline_error(exc) from exc

    def __iter__(self) -> "RayEpoch":
        return self

    def __next__(self) -> Any:
        if self._ready:
            return self._deliver()
        if self._closed or self._source is None:
            raise StopIteration
        try:
            collated = next(self._source)
        except StopIteration:
            self._finish()
            raise
        except KeyboardInterrupt:
            self._fail()
            raise
        except Exception as exc:
            self._fail()
            raise as_pipeline_error(exc) from exc
        self._ready = list(collated.batches)
        return self._deliver()

    def _deliver(self) -> Any:
        self.batches += 1
        return self._ready.pop(0)

    def _finish(self) -> None:
        """Stop Ray's execution (if still running) and keep its stats."""
        if self._closed:
            return
        self._closed = True
        self._ready = []
        source, self._source = self._source, None
        close = getattr(source, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
        if self._dataset is not None:
            stats = collect_stats(self._dataset, self._owner.label, self.batches)
            if stats is not None:
                self._owner.last_stats = stats
                self._owner.stats_history.append(stats)

    def _fail(self) -> None:
        self._finish()
        cluster.shutdown_owned()

    def close(self) -> None:
        """End the epoch now. If Ctrl-C was pressed meanwhile, stop the cluster fastpipe started."""
        self._finish()
        cluster.shutdown_if_interrupted()

    def __del__(self) -> None:  # the for loop's iterator is dropped as a KeyboardInterrupt unwinds it
        with contextlib.suppress(Exception):
            self.close()


class _Collated:
    """A collate result Ray's finalize step passes through untouched (it would reshape tuples of tensors)."""

    __slots__ = ("batches",)

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches


_COLLATE_CLASS: Any = None


def _collate_class() -> Any:
    """The NumpyBatchCollateFn subclass that rebuilds batches; made on first use so Ray loads lazily."""
    global _COLLATE_CLASS
    if _COLLATE_CLASS is not None:
        return _COLLATE_CLASS
    import pickle

    from ray.data.collate_fn import NumpyBatchCollateFn
    from torch.utils import _pytree as pytree

    class RebuildBatch(NumpyBatchCollateFn):
        """Columns back into the collate_fn's structure, zero-copy; pinned here, in Ray's prefetch thread."""

        def __init__(self, pin: Callable[[Any], Any] | None, batch_size: int | None) -> None:
            self.pin, self.batch_size = pin, batch_size
            self._specs: dict[bytes, Any] = {}

        def __call__(self, batch: dict[str, np.ndarray]) -> _Collated:
            raw = np.ascontiguousarray(batch[SPEC_COLUMN][0]).tobytes()
            spec = self._specs.get(raw)
            if spec is None:
                spec = self._specs[raw] = pickle.loads(raw)
            with warnings.catch_warnings():  # Arrow buffers from the object store are read-only
                warnings.simplefilter("ignore", UserWarning)
                leaves = [torch.from_numpy(batch[str(i)]) for i in range(spec.num_leaves)]
            rows = len(batch[SPEC_COLUMN])
            size = self.batch_size or rows
            if rows > size:  # Ray gave a task several batches: split them again, zero-copy
                pieces = [pytree.tree_unflatten([leaf[s : s + size] for leaf in leaves], spec) for s in range(0, rows, size)]
            else:
                pieces = [pytree.tree_unflatten(leaves, spec)]
            if self.pin is not None:
                pieces = [self.pin(piece) for piece in pieces]
            return _Collated(pieces)

    _COLLATE_CLASS = RebuildBatch
    return RebuildBatch


@contextlib.contextmanager
def _data_context(ray: Any, *, preserve_order: bool) -> Iterator[None]:
    """Settings for the datasets made inside: Ray Data seals the current DataContext into each new dataset.

    The user's own context is put back afterwards. Blocks are not reshaped (one block is one batch),
    progress bars are off (fastpipe has its own) and the order is the caller's choice.
    """
    with contextlib.suppress(Exception):  # Ray would warn once that its progress bars are off: fastpipe turned them off
        from ray.util.debug import log_once

        log_once("ray_data_progress_manager_disabled")
    names = ("target_max_block_size", "enable_progress_bars", "print_on_execution_start", "execution_options")
    with warnings.catch_warnings():
        # Making and copying Ray's default context trips its deprecated-field warnings: not the user's to fix
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.data\.context")
        context = ray.data.DataContext.get_current()
        saved = {name: getattr(context, name) for name in names if hasattr(context, name)}
        try:
            options = copy.deepcopy(context.execution_options)
            options.preserve_order = preserve_order
            context.execution_options = options
            context.target_max_block_size = None
            context.enable_progress_bars = False
            if "print_on_execution_start" in saved:
                context.print_on_execution_start = False
            yield
        finally:
            for name, value in saved.items():
                setattr(context, name, value)


def _map_batches(dataset: Any, fn: Callable[..., Any], *, max_retries: int, **options: Any) -> Any:
    """``dataset.map_batches`` with a bounded number of task retries.

    Ray Data retries a task whose worker died forever (``max_retries=-1``), so a dataset that
    segfaults on one sample would hang the epoch. Ray 2.5x deprecates passing ``max_retries``
    (as a raw remote argument) without offering a named replacement yet; until it does, the
    deprecation warning is silenced here, and a Ray that rejects the argument gets its default.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated.*")
        try:
            return dataset.map_batches(fn, max_retries=max_retries, **options)
        except TypeError as exc:
            if "max_retries" not in str(exc):
                raise
    return dataset.map_batches(fn, **options)


def _session_key(ray: Any) -> Any:
    """Identifies the Ray session, so an object put into a cluster that has since stopped is not reused."""
    try:
        from ray._private import worker as ray_worker

        session = ray_worker._global_node.session_name  # unique per cluster start; internal, hence guarded
    except Exception:
        session = None
    return (cluster.generation(), session, ray.get_runtime_context().get_job_id())


def _ray_running() -> bool:
    try:
        ray = require_ray()
    except ImportError:
        return False
    return ray.is_initialized()


def as_pipeline_error(exc: BaseException) -> PipelineError:
    """A clear fastpipe error from whatever Ray raised: what failed, where, and the original message."""
    text = str(exc)
    line = next((raw.strip() for raw in text.splitlines() if ERROR_PREFIX in raw), None)
    if line is not None:
        where, _, what = line[line.index(ERROR_PREFIX) + len(ERROR_PREFIX) :].partition("] ")
        stage = StageError.stage_of(what)
        if stage is not None:
            detail = what.split("] ", 1)[-1]
            message = f"stage '{stage}' raised {detail} in {where}, inside a Ray data task"
        else:
            message = f"{where} raised {what}, inside a Ray data task"
        return PipelineError(
            message + "; the same code runs there as in a DataLoader worker, so fix it in the dataset, its transform or the collate_fn",
            stage=stage,
        )
    lines = [raw.strip() for raw in text.splitlines() if raw.strip() and not raw.strip().startswith(("File ", "ray::", "\x1b"))]
    first = lines[0][:300] if lines else type(exc).__name__
    return PipelineError(
        f"the Ray data pipeline failed: {type(exc).__name__}: {first}; check the cluster (`ray status`) and the task "
        "logs under /tmp/ray/session_latest/logs",
        stage=None,
    )
