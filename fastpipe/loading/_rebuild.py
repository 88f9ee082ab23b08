"""One way to rebuild a DataLoader around another dataset, every setting of the user's kept (and to discard it).

Two callers need it, with one difference between them, chosen by ``share_sampler``:

* the diagnosis (cache points, the step check, stage costs) passes ``share_sampler=False``: the
  sampler (or custom batch sampler) and the loader's generator are deep copies, so iterating the
  new loader never moves the user's sampler position, generator or epoch;
* ``fastpipe.loading.recycled`` passes ``share_sampler=True`` for the loader it iterates in the user's
  stead: the user's own sampler and generator drive it, so ``loader.sampler.set_epoch(epoch)``
  (DistributedSampler) and a seeded generator behave exactly as they do on the loader it wraps.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from torch.utils.data import DataLoader, IterableDataset


def _copy_sampler(sampler: Any, memo: dict[int, Any]) -> Any:
    """A copy of ``sampler`` that iterating cannot advance the user's: deep, sharing only the datasets in ``memo``.

    A sampler that cannot be deep-copied is copied shallowly, its state carried over with
    ``state_dict`` / ``load_state_dict`` when it has them (resumable samplers).
    """
    if sampler is None or isinstance(sampler, (list, tuple, range)):
        return copy.copy(sampler)
    try:
        return copy.deepcopy(sampler, memo)
    except Exception:  # an unpicklable member (a lock, an open file): fall back to a shallow copy
        clone = copy.copy(sampler)
        if callable(getattr(sampler, "state_dict", None)) and callable(getattr(clone, "load_state_dict", None)):
            clone.load_state_dict(sampler.state_dict())
        return clone


def _extra_arguments(cls: type, loader: Any) -> dict[str, Any]:
    """Constructor arguments a DataLoader subclass adds (e.g. StatefulDataLoader's snapshot_every_n_steps), read back from the loader."""
    if cls is DataLoader:
        return {}
    base = set(inspect.signature(DataLoader.__init__).parameters)
    extra = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name in base or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hasattr(loader, name):
            extra[name] = getattr(loader, name)
    return extra


def rebuild_loader(
    loader: Any, dataset: Any, *, share_sampler: bool = False, timeout: float | None = None, plain: bool = False, **overrides: Any
) -> Any:
    """A new loader over ``dataset`` with every setting of ``loader`` kept, except ``overrides`` (e.g. ``num_workers=3``).

    Args:
        loader: a DataLoader (or subclass), or a loader that rebuilds itself with ``with_dataset``
            (a RecycledLoader, a RayLoader), which is asked to.
        dataset: what the new loader reads.
        share_sampler: False (the diagnosis): the sampler or batch sampler and the generator are
            copies, and iterating the new loader leaves the user's untouched. True
            (``fastpipe.loading.recycled``): the user's own objects, so ``set_epoch`` and seeding apply to both.
        timeout: replaces the loader's own only when it has none and workers run, as a guard against hangs.
        plain: build a plain DataLoader whatever the loader's class (timm's MultiEpochsDataLoader, whose workers never
            end, is unwrapped this way).
        overrides: DataLoader arguments to change.

    The loader's class is kept when it can be rebuilt with the same arguments (a DataLoader
    subclass such as torchdata's StatefulDataLoader), else a plain DataLoader is built
    (``type(result) is type(loader)`` tells which). Without workers, ``persistent_workers`` is
    off and ``prefetch_factor`` unset, as DataLoader requires.
    """
    if not isinstance(loader, DataLoader) and hasattr(loader, "with_dataset"):
        # e.g. a RayLoader or a RecycledLoader rebuilds itself around the wrapped dataset
        return loader.with_dataset(dataset, **overrides) if overrides else loader.with_dataset(dataset)

    def setting(name: str) -> Any:
        return overrides[name] if name in overrides else getattr(loader, name)

    memo: dict[int, Any] = {id(d): d for d in (getattr(loader, "dataset", None), dataset) if d is not None}

    def own(value: Any) -> Any:
        return value if share_sampler else _copy_sampler(value, memo)

    generator = setting("generator")
    workers = setting("num_workers")
    own_timeout = setting("timeout")
    kwargs: dict[str, Any] = dict(
        num_workers=workers,
        collate_fn=setting("collate_fn"),
        pin_memory=setting("pin_memory"),
        timeout=own_timeout if own_timeout or timeout is None or workers == 0 else timeout,
        worker_init_fn=setting("worker_init_fn"),
        multiprocessing_context=setting("multiprocessing_context"),
        generator=generator if share_sampler or generator is None else copy.deepcopy(generator, memo),
        persistent_workers=bool(setting("persistent_workers")) and workers > 0,
        pin_memory_device=setting("pin_memory_device"),
    )
    if workers > 0:
        kwargs["prefetch_factor"] = setting("prefetch_factor")  # None (a loader without workers): DataLoader's default
    if "in_order" in overrides or hasattr(loader, "in_order"):
        kwargs["in_order"] = setting("in_order")
    batch_size, sampler = setting("batch_size"), setting("sampler")
    if isinstance(dataset, IterableDataset):  # no sampler: the dataset orders itself
        kwargs.update(batch_size=batch_size, drop_last=setting("drop_last"))
    elif batch_size is not None:  # the DataLoader built its own BatchSampler from these
        kwargs.update(batch_size=batch_size, sampler=own(sampler), drop_last=setting("drop_last"))
    elif setting("batch_sampler") is not None:
        kwargs["batch_sampler"] = own(setting("batch_sampler"))
    else:
        kwargs.update(batch_size=None, sampler=own(sampler))
    cls = type(loader) if isinstance(loader, DataLoader) and not plain else DataLoader
    if cls is not DataLoader:
        try:
            return cls(dataset, **kwargs, **_extra_arguments(cls, loader))
        except TypeError:  # a subclass with its own constructor: the plain class keeps every setting above
            pass
    return DataLoader(dataset, **kwargs)


def discard_loader(loader: Any) -> None:
    """Free what a loader built for one use holds beyond its workers: a recycled loader's rings and the page locks
    on them (its ``stats()`` stay readable). Other loaders hold nothing more and are left as they are."""
    from fastpipe.loading.recycle import RecycledLoader  # recycle builds its loaders with rebuild_loader above

    if isinstance(loader, RecycledLoader):
        loader.close()
