"""Wrapped loaders are loaders: reach the DataLoader inside a prefetcher or a trainer's adapter, keep what it does.

Training scripts rarely hand the loop a bare ``torch.utils.data.DataLoader``: timm's ``create_loader`` returns a
``PrefetchLoader`` (copy on a side stream, then Normalize and, with ``re_prob``, RandomErasing on the GPU), accelerate's
``prepare`` returns a ``DataLoaderShard`` or ``DataLoaderDispatcher``, fastpipe's own ``DevicePrefetcher`` and
``watch`` wrap the loader they are given. The diagnosis needs the DataLoader itself (it rebuilds it around cached
datasets), and the model must still see what the wrapper gave it. :func:`unwrap_loader` peels the layers it knows,
outermost first, and returns the loader inside with the device-side work as one ``batch -> batch`` transform, run
after fastpipe's own copy; each layer is described in words, for the report.

Known wrappers are matched by their class's module and name along its MRO, so neither timm nor accelerate is
imported here. A wrapper of another kind implements :class:`~fastpipe.loading._protocols.WrapsLoader`; a loader
that is no wrapper at all implements :class:`~fastpipe.loading._protocols.RebuildsAroundDataset`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from fastpipe.errors import ConfigError
from fastpipe.loading._protocols import RebuildsAroundDataset, WrapsLoader
from fastpipe.loading._rebuild import rebuild_loader

MAX_LAYERS = 8


@dataclass(frozen=True)
class Unwrapped:
    """What :func:`unwrap_loader` found.

    Attributes:
        loader: the DataLoader (or a loader that rebuilds itself) inside every wrapper.
        device_transform: the wrappers' device-side work, innermost first, as one ``batch -> batch``; None if none.
        prefetch_depth: batches the outermost prefetching wrapper copied ahead (None: no wrapper prefetched).
        layers: one sentence per wrapper peeled, outermost first (empty: the loader was not wrapped).
    """

    loader: Any
    device_transform: Callable[[Any], Any] | None = None
    prefetch_depth: int | None = None
    layers: tuple[str, ...] = ()


class TimmPrefetchTransform:
    """What timm's ``PrefetchLoader`` does to a batch after its copy: ``input.to(dtype).sub_(mean).div_(std)`` (mean and
    std in 0..255 units), then its ``RandomErasing`` (per sample, on the device) when ``re_prob`` > 0; targets pass."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, dtype: torch.dtype, random_erasing: Any = None) -> None:
        self.mean, self.std, self.dtype = mean.detach().cpu(), std.detach().cpu(), dtype
        self.random_erasing = random_erasing
        self._erasing_on: dict[torch.device, Any] = {}

    def _erasing(self, device: torch.device) -> Any:
        if self.random_erasing is None or getattr(self.random_erasing, "device", device) == device:
            return self.random_erasing
        if device not in self._erasing_on:  # timm draws its fill on its own device: a copy that draws on the batch's
            clone = copy.copy(self.random_erasing)
            clone.device = device
            self._erasing_on[device] = clone
        return self._erasing_on[device]

    def __call__(self, batch: Any) -> Any:
        images, *rest = batch
        mean, std = self.mean.to(images.device, self.dtype), self.std.to(images.device, self.dtype)
        images = images.to(self.dtype).sub_(mean).div_(std)
        erasing = self._erasing(images.device)
        if erasing is not None:
            images = erasing(images)
        return type(batch)([images, *rest]) if isinstance(batch, list) else (images, *rest)

    def __repr__(self) -> str:
        erasing = "" if self.random_erasing is None else f", then {type(self.random_erasing).__name__}(p={self.random_erasing.probability})"
        mean, std = ([round(v, 3) for v in t.flatten().tolist()] for t in (self.mean, self.std))
        return f"TimmPrefetchTransform(Normalize(mean={mean}, std={std}, in 0..255 units){erasing})"


class Chain:
    """Device transforms in order: the first one's output is the next one's input."""

    def __init__(self, *steps: Callable[[Any], Any]) -> None:
        self.steps = tuple(step for step in steps if step is not None)

    def __call__(self, batch: Any) -> Any:
        for step in self.steps:
            batch = step(batch)
        return batch

    def __repr__(self) -> str:
        return " -> ".join(map(repr, self.steps))


def chain(*steps: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """The device transforms that are not None, as one (None when none are left)."""
    kept = [step for step in steps if step is not None]
    return None if not kept else kept[0] if len(kept) == 1 else Chain(*kept)


def _names(obj: Any) -> set[str]:
    """``module.Class`` of ``obj``'s real class and its bases (``type()``: accelerate's adapters lie in ``__class__``)."""
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(obj).__mro__}


def type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _timm_prefetch(obj: Any) -> tuple[Any, Callable[[Any], Any], int, str]:
    transform = TimmPrefetchTransform(obj.mean, obj.std, obj.img_dtype, obj.random_erasing)
    erasing = "" if obj.random_erasing is None else f" and RandomErasing(p={obj.random_erasing.probability}, per sample)"
    return (
        obj.loader,
        transform,
        1,
        f"timm's PrefetchLoader unwrapped: its copy is fastpipe's (one batch ahead, as timm's side stream), and its "
        f"Normalize (x 255 units, to {obj.img_dtype}){erasing} run on the device after the copy, as the workload's device transform",
    )


def _timm_multi_epochs(obj: Any) -> tuple[Any, None, None, str]:
    overrides: dict[str, Any] = {}
    if obj.batch_size is None and obj.batch_sampler is not None and hasattr(obj.batch_sampler, "sampler"):
        overrides["batch_sampler"] = obj.batch_sampler.sampler  # its _RepeatSampler wraps the user's batch sampler
    elif obj.batch_size is None and hasattr(obj.sampler, "sampler"):
        overrides["sampler"] = obj.sampler.sampler
    inner = rebuild_loader(obj, obj.dataset, share_sampler=True, plain=True, **overrides)
    return (
        inner,
        None,
        None,
        "timm's MultiEpochsDataLoader measured as a plain DataLoader with the same settings (its workers live across "
        "epochs, as persistent_workers=True keeps them)",
    )


def _accelerate(obj: Any) -> tuple[Any, None, None, str]:
    kind = type(obj).__name__
    what = "its copy to the device is fastpipe's" if kind == "DataLoaderShard" else "its broadcast of batches from rank 0 is not timed"
    return obj.base_dataloader, None, None, f"accelerate's {kind} unwrapped to the DataLoader it prepared: {what}"


def _fastpipe_prefetcher(obj: Any) -> tuple[Any, Callable[[Any], Any] | None, int, str]:
    what = "" if obj.transform is None else f", and its transform ({obj.transform!r}) runs on the device after the copy"
    return obj.loader, obj.transform, obj.depth, f"fastpipe's {type(obj).__name__} unwrapped: depth {obj.depth}{what}"


def _watch(obj: Any) -> tuple[Any, None, None, str]:
    return obj.loader, None, None, "fastpipe.watch unwrapped: the loader it watches is diagnosed"


def _declared(obj: Any) -> tuple[Any, Callable[[Any], Any] | None, None, str]:
    return obj.wrapped_loader, obj.wrapped_device_transform, None, f"{type_name(obj)} unwrapped (it declares WrapsLoader)"


#: ``module.Class`` of each known wrapper -> how to peel it: (inner loader, device transform, prefetch depth, sentence).
KNOWN: dict[str, Callable[[Any], tuple[Any, Any, Any, str]]] = {
    "timm.data.loader.PrefetchLoader": _timm_prefetch,
    "timm.data.loader.MultiEpochsDataLoader": _timm_multi_epochs,
    "accelerate.data_loader.DataLoaderShard": _accelerate,
    "accelerate.data_loader.DataLoaderDispatcher": _accelerate,
    "fastpipe.loading._prefetch.DevicePrefetcher": _fastpipe_prefetcher,
    "fastpipe.loading._tnt.TntPrefetcher": _fastpipe_prefetcher,
    "fastpipe.monitor._watch.Watch": _watch,
}


def _peeler(obj: Any) -> Callable[[Any], tuple[Any, Any, Any, str]] | None:
    names = _names(obj)
    for name, peel in KNOWN.items():
        if name in names:
            return peel
    return _declared if isinstance(obj, WrapsLoader) else None


def unwrap_loader(obj: Any) -> Unwrapped:
    """The loader inside ``obj`` and what its wrappers do on the device (see the module docstring).

    Raises:
        ConfigError: ``obj`` is neither a DataLoader, nor a loader that rebuilds itself, nor a wrapper fastpipe
            knows; the message names its type and the protocol to implement.
    """
    layers: list[str] = []
    transforms: list[Callable[[Any], Any]] = []
    depth: int | None = None
    for _ in range(MAX_LAYERS):
        peel = _peeler(obj)
        if peel is None:
            break
        obj, transform, layer_depth, sentence = peel(obj)
        layers.append(sentence)
        if transform is not None:
            transforms.insert(0, transform)  # an inner wrapper's work happens first
        if depth is None and layer_depth is not None:
            depth = layer_depth
    if not (isinstance(obj, (DataLoader, RebuildsAroundDataset)) and _peeler(obj) is None):
        raise ConfigError(
            f"fastpipe cannot use a {type_name(obj)} as a loader: it is not a torch.utils.data.DataLoader and holds none that "
            "fastpipe knows how to reach. Return the DataLoader inside it, or give its class the hooks of "
            "fastpipe.loading.WrapsLoader (`wrapped_loader`, `wrapped_device_transform`: a wrapper) or "
            "fastpipe.loading.RebuildsAroundDataset (`dataset`, `with_dataset(dataset, **overrides)`: a loader of its own), "
            "both in fastpipe/loading/_protocols.py"
        )
    return Unwrapped(obj, chain(*transforms), depth, tuple(layers))
