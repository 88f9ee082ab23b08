"""When ``cudaHostRegister`` refuses the ring's buffers, fastpipe.loading.recycled warns once and pins each batch by a copy.

Run on the CPU through CUDA's own registrar (``hostpin.CUDA``, what a GPU run uses), with only fastpipe's calls
into the CUDA runtime replaced: ``register`` answers an error code as a locked-memory limit would, and
``pin_copy`` (``Tensor.pin_memory``, which needs a GPU) clones. The GPU run failed this because the registrar had
bound the original ``register`` when the module was imported, so replacing it changed nothing;
``tests/loading/test_prefetch_gpu.py::test_registration_failure_falls_back_to_pinned_copies`` is the same on a GPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastpipe.loading.recycle._hostpin as hostpin
from fastpipe.loading.recycle import RecycledLoader


class Marked(Dataset):
    """Sample i is a 3x16x16 uint8 image filled with ``i % 200`` (never 255, the poison) and its index."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 16, 16), index % 200, dtype=torch.uint8), index


def wrong_samples(images: torch.Tensor, labels: torch.Tensor) -> int:
    expected = (labels % 200).to(images.dtype).view(-1, 1, 1, 1)
    return int((images != expected).flatten(1).any(dim=1).sum())


class CudaRuntime:
    """Records fastpipe's calls into the CUDA runtime; ``register`` answers ``code``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
        self.registered: list[int] = []
        self.unregistered: list[int] = []
        self.copies = 0
        monkeypatch.setattr(hostpin, "register", self._register)
        monkeypatch.setattr(hostpin, "unregister", lambda buffer: self.unregistered.append(buffer.data_ptr()))
        monkeypatch.setattr(hostpin, "pin_copy", self._pin_copy)
        monkeypatch.setattr(hostpin, "_cuda_fence", lambda: False)  # nothing queued on a device here
        self.code = code

    def _register(self, buffer: torch.Tensor) -> int:
        self.registered.append(buffer.data_ptr())
        return self.code

    def _pin_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        self.copies += 1
        return tensor.clone()


def ring(workers: int = 2) -> RecycledLoader:
    loader = DataLoader(Marked(), batch_size=8, num_workers=workers, pin_memory=True)
    return RecycledLoader(loader, slots=3, poison=255, registrar=hostpin.CUDA)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_refused_registration_warns_once_and_pins_by_copy(monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    runtime = CudaRuntime(monkeypatch, code=1)  # cudaErrorInvalidValue
    recycled = ring(workers)
    with pytest.warns(
        RuntimeWarning, match=r"could not register the ring's buffers as pinned memory \(cudaHostRegister returned error 1\)"
    ) as caught:
        batches = list(recycled)
    assert len([w for w in caught if "could not register" in str(w.message)]) == 1, "one warning, not one per batch"
    assert len(runtime.registered) == 1, "after the first refusal no buffer is offered to CUDA again"
    assert len(batches) == 6 and runtime.copies == 2 * len(batches), "every tensor of every batch is a pinned copy"
    assert sum(wrong_samples(images, labels) for images, labels in batches) == 0, "copies: slots reused under them are not seen"
    assert recycled.stats()["pinning"] == "copied (cudaHostRegister returned error 1)"
    recycled.close()
    assert not runtime.unregistered, "nothing was registered, so nothing is unregistered"


def test_control_a_registration_that_succeeds_neither_warns_nor_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = CudaRuntime(monkeypatch, code=0)
    before = hostpin.registered_bytes()
    recycled = ring()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        iterator = iter(recycled)
        images, labels = next(iterator)
        assert hostpin.registered_bytes() > before, "registered buffers are counted as pinned memory"
        assert wrong_samples(images, labels) == 0
        del images, labels
        for _ in iterator:
            pass
    assert runtime.registered and runtime.copies == 0
    assert recycled.stats()["pinning"] == "register"
    recycled.close()
    assert sorted(runtime.unregistered) == sorted(runtime.registered)
    assert hostpin.registered_bytes() == before, "every buffer unregistered is taken off the count"
