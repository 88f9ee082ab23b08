"""Planted-cost fixtures: datasets, transforms and clocks whose costs are known by construction.

Costs are sleeps, not busy loops, so they hold on a loaded 2-core machine and add up per
worker the way real per-sample costs do. Also :func:`within`, which fails a test that hangs
instead of blocking the suite.
"""

from __future__ import annotations

import threading
import time
from itertools import islice
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import Dataset


class Sleep:
    """A transform stage that takes ``ms`` per sample and returns its input unchanged."""

    def __init__(self, ms: float = 0.0) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1000)
        return x


class Fast(Sleep):
    pass


class Slow(Sleep):
    pass


class AddOne:
    """An in-place stage: if a cache handed out its own copy, values would pile up."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


class Raise:
    def __init__(self, message: str = "planted failure") -> None:
        self.message = message

    def __call__(self, x: Any) -> Any:
        raise ValueError(self.message)


class PlantedDataset(Dataset):
    """Samples of a given shape; the raw load sleeps ``raw_ms``; ``transform`` as torchvision datasets use it."""

    def __init__(
        self,
        length: int = 400,
        shape: tuple[int, ...] = (3, 8, 8),
        raw_ms: float = 0.0,
        transform: Callable[[Any], Any] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.length, self.shape, self.raw_ms, self.transform, self.dtype = length, shape, raw_ms, transform, dtype

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.raw_ms:
            time.sleep(self.raw_ms / 1000)
        x = torch.full(self.shape, float(index % 7), dtype=self.dtype)
        if self.transform is not None:
            x = self.transform(x)
        return x, index % 10


class NoTransformDataset(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(4)


# ----- dataset shapes that stage discovery must handle (issue 12) ----------------------------
class TwoViews(PlantedDataset):
    """Calls its transform twice per sample, as contrastive (SimCLR) datasets do."""

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        if self.raw_ms:
            time.sleep(self.raw_ms / 1000)
        x = torch.full(self.shape, float(index % 7), dtype=self.dtype)
        return (self.transform(x), self.transform(x)), index % 10


class PostProcessed(PlantedDataset):
    """Changes its transform's output before returning it (``.float()`` of uint8), so no point can put a cached value back."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("dtype", torch.uint8)
        super().__init__(**kwargs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.raw_ms:
            time.sleep(self.raw_ms / 1000)
        x = torch.full(self.shape, index % 7, dtype=self.dtype)
        return self.transform(x).float(), index % 10


class HeldAsDs(Dataset):
    """A wrapper that keeps its inner dataset as ``self.ds`` (issue 14, item 3)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, index: int) -> Any:
        return self.ds[index]


class TransformProperty(Dataset):
    """Exposes the inner dataset's transform through a property (with a setter that writes through)."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    @property
    def transform(self) -> Any:
        return self.inner.transform

    @transform.setter
    def transform(self, value: Any) -> None:
        self.inner.transform = value

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        return self.inner[index]


class OwnGetitem(Dataset):
    """Runs its steps in its own ``__getitem__``: no transform attribute, nothing fastpipe can see."""

    def __init__(self, length: int = 64, raw_ms: float = 0.0, steps: list[Callable[[Any], Any]] | None = None) -> None:
        self.length, self.raw_ms, self.steps = length, raw_ms, steps or []

    def read(self, index: int) -> torch.Tensor:
        if self.raw_ms:
            time.sleep(self.raw_ms / 1000)
        return torch.full((3, 8, 8), float(index % 7))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.read(index)
        for step in self.steps:
            x = step(x)
        return x, index % 10


class DeclaredStages(OwnGetitem):
    """OwnGetitem after following fastpipe's hint: its steps held in a fastpipe.stages.Stages and called from __getitem__."""

    def __init__(self, length: int = 64, raw_ms: float = 0.0, steps: list[Callable[[Any], Any]] | None = None) -> None:
        from fastpipe.stages import Stages

        super().__init__(length, raw_ms, steps)
        self.stages = Stages(load=self.read, transforms=self.steps)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.stages(index), index % 10


def hf_dataset(length: int = 64, transform: Callable[[Any], Any] | None = None) -> Any:
    """A Hugging Face ``datasets.Dataset`` of small float rows with ``set_transform(transform)``; skips without the package."""
    import pytest

    datasets = pytest.importorskip("datasets", reason="Hugging Face `datasets` is not installed (pip install fastpipe[hf])")
    dataset = datasets.Dataset.from_dict({"x": [[float(i % 7)] * 12 for i in range(length)], "label": [i % 10 for i in range(length)]})
    if transform is not None:
        dataset.set_transform(transform)
    return dataset


class ToTensorColumn:
    """A Hugging Face batch transform: the ``x`` column of a batch of rows becomes tensors."""

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        batch["x"] = [torch.tensor(row) for row in batch["x"]]
        return batch


class SleepBatch(Sleep):
    """A Hugging Face batch transform that takes ``ms`` per call and returns the batch unchanged."""


# ----- a registrar that counts (recycled batch memory without a GPU) -------------------------
class CountingRegistrar:
    """Stands in for cudaHostRegister / cudaHostUnregister: records which buffers are registered right now.

    ``registrar`` is the :class:`fastpipe.loading.recycle._hostpin.Registrar` to inject; ``live`` the
    addresses registered and not yet unregistered; unregistering an address that is not registered
    is recorded in ``errors`` (CUDA would fail on it).
    """

    def __init__(self) -> None:
        from fastpipe.loading.recycle._hostpin import Registrar

        self.registered = 0
        self.unregistered = 0
        self.synchronized = 0
        self.live: set[int] = set()
        self.errors: list[str] = []
        self.registrar = Registrar(self._register, self._unregister, self._synchronize, lambda: False, torch.clone)

    def _register(self, buffer: torch.Tensor) -> int:
        self.registered += 1
        self.live.add(buffer.data_ptr())
        return 0

    def _unregister(self, buffer: torch.Tensor) -> None:
        self.unregistered += 1
        if buffer.data_ptr() not in self.live:
            self.errors.append(f"unregistered {buffer.data_ptr():#x}, which is not registered")
        self.live.discard(buffer.data_ptr())

    def _synchronize(self) -> None:
        self.synchronized += 1


# ----- an independent measurement: the user's loop, timed outside fastpipe ---------------------
def plain_loop_step_ms(loader: Any, device_spec: str, *, steps: int = 6, warmup: int = 2) -> float:
    """Mean wall ms per step of a plain training loop over ``loader`` (fetch, copy, step) on ``device_spec``.

    Timed here with ``time.perf_counter`` around the loop, with none of fastpipe's measuring code (no
    cache points, no rounds, no stopping rule): a figure to check a report's figures against.
    """
    from fastpipe.devices import parse_device

    device = parse_device(device_spec)
    iterator = iter(loader)
    try:
        for _ in range(warmup):
            device.run_step(lambda batch: None, device.to_device(next(iterator)))
        device.synchronize()
        began = time.perf_counter()
        for _ in range(steps):
            device.run_step(lambda batch: None, device.to_device(next(iterator)))
        device.synchronize()
        return (time.perf_counter() - began) * 1000 / steps
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


class Ticks:
    """A clock that moves one second a read: each timed copy takes exactly one second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def served(dataset: Iterable[Any], n: int) -> list:
    """The first ``n`` items of one pass over ``dataset``."""
    return list(islice(iter(dataset), n))


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result or exception, or a failure if it is still running after ``seconds`` (a hang fails the test)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001  (handed to the test)
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def quick_options(**knobs: Any) -> Any:
    """``DiagnoseOptions`` for a test of the ladder: no progress bar, and the loader-memory and start-up passes off
    (on by default, as in the CLI, and each costs seconds) unless the test names them in ``knobs``."""
    from fastpipe.diagnosis._options import DiagnoseOptions

    return DiagnoseOptions(**{"progress": False, "loader_memory": False, "startup": False, **knobs})
