"""Ring buffers as pinned memory, without a second copy: registered on CUDA, marked on the sim device.

A DataLoader with ``pin_memory=True`` copies every batch into page-locked memory in a thread.
The ring's buffers are reused, so they can be page-locked once, in place, with
``cudaHostRegister``; a non-blocking copy then reads them directly. Registration can fail (a
kernel or container that limits locked memory, a driver that refuses shared mappings): then
the batch is pinned the usual way, by a copy, and :class:`HostPinner` says so once.

On the simulated device nothing can be locked, and the ring buffers count as pinned memory,
as they would be on a GPU.

Every registration is undone before its memory can be unmapped: :class:`Registrations` keeps
each registered buffer alive until it is unregistered, which happens when the ring no longer
needs it (a later ``next()``, ``close()`` of an epoch), when the loader is closed or collected,
and when the diagnosis discards a point's loader. How buffers are registered is a
:class:`Registrar` (CUDA's by default), so tests count registrations without a GPU.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch


def storage_refs(tensor: torch.Tensor) -> int:
    """How many tensors (views included) hold ``tensor``'s memory right now.

    Compared with the count taken when only the ring held a buffer, it tells whether anyone
    still uses a batch: the user's variables, a list it was kept in, a view of one sample.
    """
    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


def register(buffer: torch.Tensor) -> int:
    """``cudaHostRegister`` the buffer; returns CUDA's error code (0 on success)."""
    cudart = torch.cuda.cudart()
    code = cudart.cudaHostRegister(buffer.data_ptr(), buffer.numel() * buffer.element_size(), 0)
    return int(getattr(code, "value", code))


def unregister(buffer: torch.Tensor) -> None:
    """Undo :func:`register`; must run before the memory is unmapped."""
    torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())


def pin_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A page-locked copy of ``tensor`` from PyTorch's caching host allocator (``Tensor.pin_memory``)."""
    return tensor.pin_memory()


def _cuda_fence() -> Any:
    event = torch.cuda.Event()
    event.record()
    return event


@dataclass(frozen=True)
class Registrar:
    """How ring buffers are page-locked in place, and how to wait for the device work that may read them."""

    register: Callable[[torch.Tensor], int]
    """Lock a buffer; returns 0 on success, else an error code (the batch is then pinned by a copy)."""
    unregister: Callable[[torch.Tensor], None]
    """Undo ``register``."""
    synchronize: Callable[[], None]
    """Wait until queued device work (a non_blocking copy out of a buffer) is done, before unregistering in bulk."""
    fence: Callable[[], Any]
    """A mark after the device work queued so far, with ``query()``; or False when nothing can be queued."""
    pin_copy: Callable[[torch.Tensor], torch.Tensor]
    """A page-locked copy of a tensor, for batches whose buffer is not registered (fallbacks, refusals)."""


def _cuda_synchronize() -> None:
    for index in range(torch.cuda.device_count()):  # a batch may have been copied to any of them
        torch.cuda.synchronize(index)


# Each entry looks the module's function up when called, not when this line ran: code (and a test) that
# replaces ``register`` here, e.g. to make registration fail, changes what the CUDA registrar does.
CUDA = Registrar(
    register=lambda buffer: register(buffer),
    unregister=lambda buffer: unregister(buffer),
    synchronize=lambda: _cuda_synchronize(),
    fence=lambda: _cuda_fence(),
    pin_copy=lambda tensor: pin_copy(tensor),
)


_tally_lock = threading.Lock()
_registered_bytes = 0
"""Bytes this process holds page-locked through CUDA's registrar, summed over every loader's :class:`Registrations`."""


def registered_bytes() -> int:
    """Host memory fastpipe itself page-locked with ``cudaHostRegister`` and has not unregistered yet.

    PyTorch's host-allocator statistics (``torch.cuda.host_memory_stats``) count only the pinned blocks
    that ``pin_memory()`` allocates; buffers registered in place are invisible to them, so the memory
    section adds this (see :func:`fastpipe.diagnosis.memory._probes.pinned_host_bytes`).
    """
    return _registered_bytes


def _tally(buffer: torch.Tensor, registrar: Registrar, sign: int) -> None:
    global _registered_bytes
    if registrar is CUDA:  # a test's counting fake locks nothing
        with _tally_lock:
            _registered_bytes += sign * buffer.numel() * buffer.element_size()


class Registrations:
    """The buffers one loader registered, each held (so still mapped) until it is unregistered.

    Shared with the loader's garbage-collection finalizer, so it must not refer to the loader.
    """

    def __init__(self) -> None:
        self._live: dict[int, tuple[torch.Tensor, Registrar]] = {}

    def __len__(self) -> int:
        return len(self._live)

    def add(self, buffer: torch.Tensor, registrar: Registrar) -> None:
        replaced = self._live.get(buffer.data_ptr())
        if replaced is not None:  # registered again at the same address: count it once
            _tally(replaced[0], replaced[1], -1)
        self._live[buffer.data_ptr()] = (buffer, registrar)
        _tally(buffer, registrar, +1)

    def unregister(self, buffer: torch.Tensor) -> None:
        """Unregister one buffer (nothing if it is not registered here, e.g. already released by ``release_all``)."""
        entry = self._live.pop(buffer.data_ptr(), None)
        if entry is not None and entry[0] is buffer:
            entry[1].unregister(buffer)
            _tally(buffer, entry[1], -1)
        elif entry is not None:  # another buffer now at that address: not ours to undo
            self._live[buffer.data_ptr()] = entry

    def release_all(self) -> None:
        """Unregister every buffer, once the device work that may read them is done.

        Batches still held stay valid (their tensors keep the memory mapped); they are no longer page-locked.
        """
        if not self._live:
            return
        entries, self._live = list(self._live.values()), {}
        for registrar in {id(r): r for _, r in entries}.values():
            registrar.synchronize()
        for buffer, registrar in entries:
            registrar.unregister(buffer)
            _tally(buffer, registrar, -1)


class HostPinner:
    """Pins the ring's buffers for one device: ``"register"`` (CUDA), ``"mark"`` (sim) or ``"none"``.

    ``registrar``: None for CUDA's, used on CUDA only; one given is used on any device that is asked
    for pinned memory (tests inject a counting fake).
    """

    def __init__(self, device: Any, pin_memory: bool, registrar: Registrar | None = None) -> None:
        kind = getattr(device, "kind", None)
        self.device = device
        self.registrar = CUDA if registrar is None else registrar
        if registrar is not None and pin_memory:
            self.mode = "register"
        elif kind == "sim" and pin_memory:
            self.mode = "mark"
        elif pin_memory and torch.cuda.is_available() and kind in (None, "cuda"):
            self.mode = "register"
        else:
            self.mode = "none"
        self.failed: str | None = None
        """Why registration failed, once it has: batches are then pinned by a copy."""

    def register(self, buffer: torch.Tensor) -> bool:
        """Register a newly mapped buffer; False (and copies from then on) where CUDA refuses."""
        if self.mode != "register" or self.failed is not None:
            return False
        code = self.registrar.register(buffer)
        if code == 0:
            return True
        self.failed = f"cudaHostRegister returned error {code}"
        warnings.warn(
            f"fastpipe.loading.recycled: could not register the ring's buffers as pinned memory ({self.failed}); "
            "falling back to copying each batch into pinned memory, as DataLoader(pin_memory=True) does. "
            "Raise the locked-memory limit (ulimit -l) to avoid the copy.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False

    def pin_views(self, views: list[torch.Tensor]) -> list[torch.Tensor]:
        """The batch's tensors as the device should see them: marked, already pinned, or pinned by a copy."""
        if self.mode == "mark":
            for view in views:  # the sim device's copies of them then overlap, like a GPU's
                self.device.mark_pinned(view)
            return views
        if self.mode == "register" and self.failed is not None:
            return [self.registrar.pin_copy(view) for view in views]
        return views
