"""Where the training step runs: ``cuda[:N]``, ``cpu``, or ``sim:STEP_MS[,h2d_gbps=G]``.

The simulated accelerator exists so the diagnosis can be run, tested and trusted on a
machine without a GPU, and to answer "would my pipeline keep up with a device N times
faster than mine?". It follows CUDA's semantics where they matter for input pipelines:

* a step takes ``STEP_MS`` of wall time and no CPU (a sleep, which releases the GIL);
* a host-to-device copy of B bytes occupies one modelled copy engine for B/G seconds;
* a pageable (or blocking) copy blocks the host for that long;
* a non-blocking copy from pinned memory returns at once and overlaps with the host and
  with running steps; a step waits only until its own inputs have arrived.

The simulated step does not run the model; device-side transforms count as part of its
step time. Tensors "on" a sim device stay in host memory, and the copy aliases rather
than duplicates them, because a real DMA engine would not spend host CPU or memory
bandwidth either.
"""
from __future__ import annotations

import re
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.errors import ConfigError, DeviceUnavailableError

#: The article's device bound on an NVIDIA A10G: 3.45 steps/s of 256 samples, i.e. ~290 ms a step.
DEFAULT_SIM_STEP_MS = 290.0
#: A practical host-to-device bandwidth for PCIe 4.0 x16, in GB/s (1e9 bytes).
DEFAULT_H2D_GBPS = 12.0

_SIM_EXAMPLE = "e.g. --device sim:290 or --device sim:290,h2d_gbps=12"


class Device(ABC):
    """One place a training step can run. Subclasses differ in how copies and steps cost time."""

    kind: str
    spec: str

    @property
    @abstractmethod
    def torch_device(self) -> torch.device:
        """The torch device that tensors of a batch should live on for the step."""

    @property
    def runs_model(self) -> bool:
        """False for the simulated device, whose step stands in for the model."""
        return True

    def to_device(self, batch: Any, non_blocking: bool = False) -> Any:
        """Copy every tensor of ``batch`` to this device, the way ``.to(device, non_blocking=...)`` does."""
        target = self.torch_device
        return map_tensors(lambda t: t.to(target, non_blocking=non_blocking), batch)

    def pin(self, batch: Any) -> Any:
        """``batch`` in page-locked host memory, ready for a non-blocking copy to this device."""
        return batch

    def run_step(self, step: Callable[[Any], Any], batch: Any) -> Any:
        """Run one training step on a batch that is already on this device."""
        return step(batch)

    def synchronize(self) -> None:
        """Wait until all queued device work is finished, so wall-clock timings are honest."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"

    def __str__(self) -> str:
        return self.spec


class CpuDevice(Device):
    """The real model on the CPU. Copies are no-ops; the step competes with the loader for cores."""

    kind = "cpu"
    spec = "cpu"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")


class CudaDevice(Device):
    """A CUDA GPU. Copies and steps are asynchronous; ``synchronize`` makes timings honest."""

    kind = "cuda"

    def __init__(self, index: int | None = None) -> None:
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "device 'cuda' was asked for, but torch.cuda.is_available() is False on this machine; "
                "use --device cpu, or --device sim:290 to simulate an accelerator"
            )
        count = torch.cuda.device_count()
        if index is not None and not 0 <= index < count:
            raise DeviceUnavailableError(f"device 'cuda:{index}' does not exist; this machine has {count} GPU(s): use cuda:0..cuda:{count - 1}")
        self.index = torch.cuda.current_device() if index is None else index
        self.spec = "cuda" if index is None else f"cuda:{index}"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def pin(self, batch: Any) -> Any:
        return map_tensors(lambda t: t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory(), batch)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)


def _sleep_until(deadline: float) -> None:
    """Sleep (GIL released, no CPU) until ``time.perf_counter()`` reaches ``deadline``."""
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return
        time.sleep(remaining)


class SimDevice(Device):
    """A simulated accelerator: fixed step time, modelled copy engine, no CPU use. See the module docstring."""

    kind = "sim"

    def __init__(self, step_ms: float = DEFAULT_SIM_STEP_MS, h2d_gbps: float = DEFAULT_H2D_GBPS) -> None:
        if not step_ms > 0 or not h2d_gbps > 0:
            raise ConfigError(f"sim device needs a positive step time and bandwidth, got step_ms={step_ms}, h2d_gbps={h2d_gbps}; {_SIM_EXAMPLE}")
        self.step_s = step_ms / 1000.0
        self.h2d_bytes_per_s = h2d_gbps * 1e9
        self.spec = f"sim:{step_ms:g}" + ("" if h2d_gbps == DEFAULT_H2D_GBPS else f",h2d_gbps={h2d_gbps:g}")
        self._lock = threading.Lock()
        self._copy_engine_free_at = 0.0
        self._ready_at: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._pinned: WeakIdKeyDictionary = WeakIdKeyDictionary()

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def runs_model(self) -> bool:
        return False

    @property
    def step_ms(self) -> float:
        return self.step_s * 1000.0

    def copy_seconds(self, nbytes: int) -> float:
        """How long the modelled copy engine needs for ``nbytes``."""
        return nbytes / self.h2d_bytes_per_s

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Really pinned (on a machine with CUDA) or in this device's modelled pinned memory."""
        return tensor in self._pinned or tensor.is_pinned()

    def pin(self, batch: Any) -> Any:
        """Copy ``batch`` into modelled pinned memory. Like real pinning, it costs a host memcpy.

        Where CUDA is present the memory is really pinned; elsewhere the copy is marked as
        pinned, so later non-blocking copies of it overlap as they would on a GPU.
        """

        def pin_tensor(tensor: torch.Tensor) -> torch.Tensor:
            if self.is_pinned(tensor):
                return tensor
            pinned = tensor.pin_memory() if torch.cuda.is_available() else tensor.clone()
            self._pinned[pinned] = True
            return pinned

        return map_tensors(pin_tensor, batch)

    def _copy_tensor(self, tensor: torch.Tensor, non_blocking: bool) -> torch.Tensor:
        duration = self.copy_seconds(tensor.numel() * tensor.element_size())
        # Each copy is its own tensor object (sharing the host storage, no memcpy), so that two
        # copies of one host tensor in flight at once keep their own arrival times.
        copied = tensor.view_as(tensor)
        pinned = self.is_pinned(tensor)
        if pinned:
            self._pinned[copied] = True  # it shares the pinned storage
        with self._lock:
            start = max(time.perf_counter(), self._copy_engine_free_at)
            done = start + duration
            self._copy_engine_free_at = done
            self._ready_at[copied] = done
        if not (non_blocking and pinned):
            _sleep_until(done)  # pageable memory: the host stages the copy and waits for it
        return copied

    def to_device(self, batch: Any, non_blocking: bool = False) -> Any:
        return map_tensors(lambda t: self._copy_tensor(t, non_blocking), batch)

    def ready_time(self, batch: Any) -> float:
        """When the last copy feeding ``batch`` finishes on the modelled copy engine (0 if none is pending)."""
        with self._lock:
            return max((self._ready_at.get(t, 0.0) for t in iter_tensors(batch)), default=0.0)

    def run_step(self, step: Callable[[Any], Any], batch: Any) -> None:
        """Wait for the batch's own copies, then spend ``step_ms`` of wall time; ``step`` is not called."""
        start = max(time.perf_counter(), self.ready_time(batch))
        _sleep_until(start + self.step_s)

    def synchronize(self) -> None:
        with self._lock:
            pending = self._copy_engine_free_at
        _sleep_until(pending)


_SIM_RE = re.compile(r"^sim:(?P<ms>[^,]+)(?:,h2d_gbps=(?P<gbps>.+))?$")


def _positive_float(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"bad device '{spec}': {what} must be a positive number, got '{text}'; {_SIM_EXAMPLE}")
    return value


def parse_device(spec: "str | Device | torch.device | None" = None) -> Device:
    """Turn a device spec into a :class:`Device`. ``None`` means :func:`default_device_spec`.

    Accepted: ``cuda``, ``cuda:N``, ``cpu``, ``sim:STEP_MS`` and ``sim:STEP_MS,h2d_gbps=G``.
    """
    if isinstance(spec, Device):
        return spec
    if spec is None:
        spec = default_device_spec()
    text = str(spec).strip()
    if text == "cpu":
        return CpuDevice()
    if text == "cuda":
        return CudaDevice()
    if text.startswith("cuda:"):
        index = text[5:]
        if not index.isdigit():
            raise ConfigError(f"bad device '{text}': the GPU index must be a whole number, e.g. --device cuda:0")
        return CudaDevice(int(index))
    if text.startswith("sim"):
        match = _SIM_RE.match(text)
        if match is None:
            raise ConfigError(f"bad device '{text}': expected sim:STEP_MS[,h2d_gbps=G], {_SIM_EXAMPLE}")
        step_ms = _positive_float(match["ms"], "STEP_MS", text)
        gbps = DEFAULT_H2D_GBPS if match["gbps"] is None else _positive_float(match["gbps"], "h2d_gbps", text)
        return SimDevice(step_ms, gbps)
    raise ConfigError(f"unknown device '{text}': use cuda, cuda:N, cpu, or sim:STEP_MS ({_SIM_EXAMPLE})")


def default_device_spec() -> str:
    """``cuda`` when a GPU is present, else ``sim:290``: the article's A10G device bound (3.45 steps/s)."""
    return "cuda" if torch.cuda.is_available() else f"sim:{DEFAULT_SIM_STEP_MS:g}"
