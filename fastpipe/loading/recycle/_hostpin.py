"""Ring buffers as pinned memory, without a second copy: registered on CUDA, marked on the sim device.

A DataLoader with ``pin_memory=True`` copies every batch into page-locked memory in a thread.
The ring's buffers are reused, so they can be page-locked once, in place, with
``cudaHostRegister``; a non-blocking copy then reads them directly. Registration can fail (a
kernel or container that limits locked memory, a driver that refuses shared mappings): then
the batch is pinned the usual way, by a copy, and :class:`HostPinner` says so once.

On the simulated device nothing can be locked, and the ring buffers count as pinned memory,
as they would be on a GPU.
"""
from __future__ import annotations

import warnings
from typing import Any

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


class HostPinner:
    """Pins the ring's buffers for one device: ``"register"`` (CUDA), ``"mark"`` (sim) or ``"none"``."""

    def __init__(self, device: Any, pin_memory: bool) -> None:
        kind = getattr(device, "kind", None)
        self.device = device
        if kind == "sim" and pin_memory:
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
        code = register(buffer)
        if code == 0:
            return True
        self.failed = f"cudaHostRegister returned error {code}"
        warnings.warn(
            f"fastpipe.recycled: could not register the ring's buffers as pinned memory ({self.failed}); "
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
            return [view.pin_memory() for view in views]
        return views
