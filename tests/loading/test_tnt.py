"""prefetcher="tnt": clear errors for missing torchtnt / pkg_resources / non-CUDA devices, and the adapter.

torchtnt's prefetcher itself needs CUDA; here the adapter is driven by a stand-in with the same
constructor and iterator protocol. The real one is compared with fastpipe's in test_prefetch_gpu.py.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Iterable, Iterator

import pytest
import torch

import fastpipe.loading._tnt
from fastpipe.devices import CpuDevice
from fastpipe.errors import ConfigError, OptionalDependencyError
from fastpipe.loading._prefetch import make_prefetcher
from fastpipe.loading._tnt import TntPrefetcher, import_cuda_data_prefetcher


@pytest.fixture
def fresh_torchtnt(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Forget torchtnt's modules so the next import re-runs; put the originals back afterwards."""
    saved = {name: module for name, module in sys.modules.items() if name == "torchtnt" or name.startswith("torchtnt.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    yield monkeypatch
    for name in [n for n in sys.modules if n == "torchtnt" or n.startswith("torchtnt.")]:
        del sys.modules[name]  # half-imported leftovers of the failed import
    sys.modules.update(saved)


def test_missing_torchtnt_says_how_to_install(fresh_torchtnt: pytest.MonkeyPatch) -> None:
    fresh_torchtnt.setitem(sys.modules, "torchtnt", None)
    with pytest.raises(OptionalDependencyError, match=r"pip install 'fastpipe\[tnt\]'"):
        import_cuda_data_prefetcher()


def test_missing_pkg_resources_says_to_pin_setuptools(fresh_torchtnt: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchtnt")
    fresh_torchtnt.setitem(sys.modules, "pkg_resources", None)  # what setuptools>=81 leaves behind
    with pytest.raises(OptionalDependencyError, match=r'pip install "setuptools<81"'):
        import_cuda_data_prefetcher()


def test_another_missing_module_is_named(fresh_torchtnt: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchtnt")
    fresh_torchtnt.setitem(sys.modules, "fsspec", None)  # torchtnt.utils imports it
    with pytest.raises(OptionalDependencyError, match="needs the module 'fsspec'"):
        import_cuda_data_prefetcher()


def test_torchtnt_imports_without_the_pkg_resources_warning() -> None:
    pytest.importorskip("torchtnt")
    code = "from fastpipe.loading._tnt import import_cuda_data_prefetcher as f; print(f().__name__)"
    # -W error turns any warning left unhandled into an import failure
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "CudaDataPrefetcher"


@pytest.mark.parametrize("spec", ["cpu", "sim:10"])
def test_tnt_on_a_non_cuda_device_points_to_fastpipes(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"CUDA-only.*prefetcher='fastpipe'"):
        make_prefetcher([], spec, depth=2, transform=None, kind="tnt")


class FakeCuda(CpuDevice):
    """A device that reports itself as CUDA, so the adapter can be exercised without a GPU."""

    kind = "cuda"
    spec = "cuda"


class StandInPrefetcher:
    """torchtnt's CudaDataPrefetcher protocol without CUDA: it calls iter() on construction and in __iter__."""

    instances: list["StandInPrefetcher"] = []

    def __init__(self, data_iterable: Iterable[Any], device: torch.device, num_prefetch_batches: int = 1) -> None:
        self.device, self.num_prefetch_batches = device, num_prefetch_batches
        self.data_iter = iter(data_iterable)
        StandInPrefetcher.instances.append(self)

    def __iter__(self) -> "StandInPrefetcher":
        return self

    def __next__(self) -> Any:
        return next(self.data_iter)


class CountingLoader:
    """A loader whose iterators record iter() calls and close(), as shutdown_iterator uses it."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches, self.iterators = batches, []

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        iterator = ClosableIterator(self.batches)
        self.iterators.append(iterator)
        return iterator


class ClosableIterator:
    def __init__(self, items: list[Any]) -> None:
        self._items, self.closed = iter(items), False

    def __iter__(self) -> "ClosableIterator":
        return self

    def __next__(self) -> Any:
        return next(self._items)

    def close(self) -> None:
        self.closed = True


def test_adapter_keeps_the_prefetcher_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpipe.loading._tnt, "import_cuda_data_prefetcher", lambda: StandInPrefetcher)
    StandInPrefetcher.instances.clear()
    loader = CountingLoader([torch.tensor([i]) for i in range(4)])
    prefetcher = make_prefetcher(loader, FakeCuda(), depth=3, transform=lambda b: b * 10, kind="tnt")
    assert isinstance(prefetcher, TntPrefetcher) and len(prefetcher) == 4
    for _ in range(2):
        assert [b.item() for b in prefetcher] == [0, 10, 20, 30]
    assert len(loader.iterators) == 2, "one loader iterator (one set of workers) per epoch"
    assert [p.num_prefetch_batches for p in StandInPrefetcher.instances] == [3, 3]
    iterator = iter(prefetcher)
    assert next(iterator).item() == 0
    iterator.close()
    assert loader.iterators[-1].closed
    with pytest.raises(StopIteration):
        next(iterator)
