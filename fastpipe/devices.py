"""Where the training step runs: ``cuda[:N]``, ``cpu``, or ``sim:STEP_MS[,h2d_gbps=G]``.

The simulated accelerator exists so the diagnosis can be run, tested and trusted on a
machine without a GPU, and to answer "would my pipeline keep up with a device N times
faster than mine?". It follows CUDA's semantics where they matter for input pipelines:

* a step takes ``STEP_MS`` of device time and no CPU. It is asynchronous, as a CUDA step is: the
  host launches it (``launch_ms`` of wall time) and goes on to fetch and copy the next batch while
  it runs; the host blocks only when ``queue`` steps (default 2) are still unfinished, on
  ``synchronize()``, or after every step with ``sync=1`` (a loop that calls ``loss.item()``);
* a host-to-device copy of B bytes occupies one modelled copy engine for B/G seconds;
* a copy goes on the compute stream, as ``tensor.to(device)`` does: it starts after the steps
  launched before it, and the next step waits for it. Inside ``side_stream()`` (what a
  prefetcher uses) it only waits for the copy engine, and overlaps the running step;
* a pageable (or blocking) copy blocks the host until it is done;
* a non-blocking copy from pinned memory returns at once; a step waits until its own inputs
  have arrived.

The simulated step does not run the model; device-side transforms count as part of its
step time. Tensors "on" a sim device stay in host memory, and the copy aliases rather
than duplicates them, because a real DMA engine would not spend host CPU or memory
bandwidth either.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Callable, Iterator

import torch
from torch.utils.weak import WeakIdKeyDictionary

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.errors import ConfigError, DeviceUnavailableError

#: The article's device bound on an NVIDIA A10G: 3.45 steps/s of 256 samples, i.e. ~290 ms a step.
DEFAULT_SIM_STEP_MS = 290.0
#: A practical host-to-device bandwidth for PCIe 4.0 x16, in GB/s (1e9 bytes).
DEFAULT_H2D_GBPS = 12.0

#: Steps the host may launch ahead of the device before it blocks, as CUDA's launch queue lets it.
DEFAULT_SIM_QUEUE = 2
#: Host wall time (not CPU) to launch one step's kernels.
DEFAULT_SIM_LAUNCH_MS = 0.1

_SIM_EXAMPLE = "e.g. --device sim:290, sim:290,h2d_gbps=12 or sim:290,sync=1"


class Device(ABC):
    """One place a training step can run. Subclasses differ in how copies and steps cost time."""

    kind: str
    spec: str

    @property
    @abstractmethod
    def torch_device(self) -> torch.device:
        """The torch device that tensors of a batch should live on for the step."""

    @property
    def step_uses_worker_cores(self) -> bool:
        """Whether the step itself runs on the CPU cores the DataLoader workers use (``cpu``): then the input pipeline
        slows the step by taking its cores, with the loop rarely waiting, rather than by being late."""
        return False

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

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        """Copies issued inside run beside the compute stream (meaningful on sim; CUDA code uses its own streams)."""
        yield

    def timeline_mark(self) -> Any:
        """A mark on the device's timeline after the work launched so far (a CUDA event; a time on sim and cpu)."""
        return time.perf_counter()

    def seconds_between(self, earlier: Any, later: Any) -> float:
        """Device time between two marks; call :meth:`synchronize` first on asynchronous devices."""
        return later - earlier

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"

    def __str__(self) -> str:
        return self.spec


class CpuDevice(Device):
    """The real model on the CPU. Copies are no-ops; the step competes with the loader for cores."""

    kind = "cpu"
    spec = "cpu"

    @property
    def step_uses_worker_cores(self) -> bool:
        return True

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")


class CudaDevice(Device):
    """A CUDA GPU. Copies and steps are asynchronous; ``synchronize`` makes timings honest."""

    kind = "cuda"

    def __init__(self, index: int | None = None) -> None:
        asked = "cuda" if index is None else f"cuda:{index}"
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device '{asked}' was asked for, but torch.cuda.is_available() is False on this machine; "
                "use --device cpu, or --device sim:290 to simulate an accelerator"
            )
        count = torch.cuda.device_count()
        if index is not None and not 0 <= index < count:
            raise DeviceUnavailableError(
                f"device 'cuda:{index}' does not exist; this machine has {count} GPU(s): use cuda:0..cuda:{count - 1}"
            )
        self.index = torch.cuda.current_device() if index is None else index
        self.spec = "cuda" if index is None else f"cuda:{index}"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def pin(self, batch: Any) -> Any:
        return map_tensors(lambda t: t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory(), batch)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def timeline_mark(self) -> "torch.cuda.Event":
        """A timing event recorded on the current stream: step times are read on the GPU's clock, not the host's."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.index))
        return event

    def seconds_between(self, earlier: "torch.cuda.Event", later: "torch.cuda.Event") -> float:
        return earlier.elapsed_time(later) / 1000.0


def _sleep_until(deadline: float) -> None:
    """Sleep (GIL released, no CPU) until ``time.perf_counter()`` reaches ``deadline``."""
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return
        time.sleep(remaining)


class SimDevice(Device):
    """A simulated accelerator: fixed step time, modelled copy engine and compute queue, no CPU use.

    See the module docstring. ``sync=True`` models a loop that waits for every step (e.g. one that
    calls ``loss.item()``); by default the host only launches the step and runs ahead, as on CUDA.
    """

    kind = "sim"

    def __init__(
        self,
        step_ms: float = DEFAULT_SIM_STEP_MS,
        h2d_gbps: float = DEFAULT_H2D_GBPS,
        *,
        sync: bool = False,
        queue: int = DEFAULT_SIM_QUEUE,
        launch_ms: float = DEFAULT_SIM_LAUNCH_MS,
    ) -> None:
        if not step_ms > 0 or not h2d_gbps > 0 or queue < 1 or launch_ms < 0:
            raise ConfigError(
                f"sim device needs a positive step time, bandwidth and queue and a launch cost >= 0, got step_ms={step_ms}, "
                f"h2d_gbps={h2d_gbps}, queue={queue}, launch_ms={launch_ms}; {_SIM_EXAMPLE}"
            )
        self.step_s = step_ms / 1000.0
        self.h2d_bytes_per_s = h2d_gbps * 1e9
        self.sync, self.queue, self.launch_s = bool(sync), int(queue), launch_ms / 1000.0
        options = [] if h2d_gbps == DEFAULT_H2D_GBPS else [f"h2d_gbps={h2d_gbps:g}"]
        options += ["sync=1"] if sync else []
        options += [] if queue == DEFAULT_SIM_QUEUE else [f"queue={queue}"]
        options += [] if launch_ms == DEFAULT_SIM_LAUNCH_MS else [f"launch_ms={launch_ms:g}"]
        self.spec = ",".join([f"sim:{step_ms:g}", *options])
        self._lock = threading.Lock()
        self._copy_engine_free_at = 0.0
        self._compute_tail = 0.0
        """When the last operation on the compute (default) stream finishes: steps and the copies issued on it."""
        self._in_flight: deque[float] = deque()
        """Finish times of launched steps, oldest first; the host blocks when ``queue`` are unfinished."""
        self._stream = threading.local()
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

    def mark_pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        """Treat ``tensor``'s memory as page-locked from now on (e.g. a buffer registered once); returns it."""
        self._pinned[tensor] = True
        return tensor

    def pin(self, batch: Any) -> Any:
        """Copy ``batch`` into modelled pinned memory. Like real pinning, it costs a host memcpy.

        Where CUDA is present the memory is really pinned; elsewhere the copy is marked as
        pinned, so later non-blocking copies of it overlap as they would on a GPU.
        """

        def pin_tensor(tensor: torch.Tensor) -> torch.Tensor:
            if self.is_pinned(tensor):
                return tensor
            pinned = tensor.pin_memory() if torch.cuda.is_available() else tensor.clone()
            return self.mark_pinned(pinned)

        return map_tensors(pin_tensor, batch)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        """Copies issued in this block (this thread) run on a side stream: not ordered after queued steps.

        Without it a copy goes on the compute stream, as ``tensor.to(device)`` does on CUDA: it starts
        only once the steps launched before it have finished. A prefetcher copies on a side stream.
        """
        previous = getattr(self._stream, "side", False)
        self._stream.side = True
        try:
            yield
        finally:
            self._stream.side = previous

    def _copy_tensor(self, tensor: torch.Tensor, non_blocking: bool) -> torch.Tensor:
        duration = self.copy_seconds(tensor.numel() * tensor.element_size())
        # Each copy is its own tensor object (sharing the host storage, no memcpy), so that two
        # copies of one host tensor in flight at once keep their own arrival times.
        copied = tensor.view_as(tensor)
        pinned = self.is_pinned(tensor)
        if pinned:
            self._pinned[copied] = True  # it shares the pinned storage
        on_side_stream = getattr(self._stream, "side", False)
        with self._lock:
            start = max(time.perf_counter(), self._copy_engine_free_at)
            if not on_side_stream:  # stream order: after every step launched before it
                start = max(start, self._compute_tail)
            done = start + duration
            self._copy_engine_free_at = done
            if not on_side_stream:
                self._compute_tail = done
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
        """Launch one step of ``step_ms`` on the modelled compute queue; ``step`` is not called.

        The step starts when the steps before it are done and its own inputs have arrived. The
        host pays the launch cost and returns, blocking first only while ``queue`` steps are
        still unfinished (CUDA's launch queue), or until the step is done with ``sync``.
        """
        while True:
            with self._lock:
                now = time.perf_counter()
                while self._in_flight and self._in_flight[0] <= now:
                    self._in_flight.popleft()
                oldest = self._in_flight[0] if len(self._in_flight) >= self.queue else None
            if oldest is None:
                break
            _sleep_until(oldest)
        ready = self.ready_time(batch)
        with self._lock:
            launched = time.perf_counter() + self.launch_s
            finish = max(launched, self._compute_tail, ready) + self.step_s
            self._compute_tail = finish
            self._in_flight.append(finish)
        _sleep_until(finish if self.sync else launched)

    def timeline_mark(self) -> float:
        """When the last launched step will finish: the device-side clock that step times are read from."""
        with self._lock:
            return self._compute_tail

    def synchronize(self) -> None:
        with self._lock:
            pending = max(self._copy_engine_free_at, self._compute_tail)
        _sleep_until(pending)


_SIM_RE = re.compile(r"^sim:(?P<ms>[^,]+)(?P<options>(?:,[a-z0-9_]+=[^,]*)*)$")
_SIM_OPTIONS = ("h2d_gbps", "sync", "queue", "launch_ms")


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

    Accepted: ``cuda``, ``cuda:N``, ``cpu`` and ``sim:STEP_MS[,h2d_gbps=G][,sync=1][,queue=N][,launch_ms=L]``.
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
        options = dict(item.split("=", 1) for item in match["options"].split(",")[1:])
        unknown = sorted(set(options) - set(_SIM_OPTIONS))
        if unknown:
            raise ConfigError(
                f"bad device '{text}': unknown option(s) {', '.join(unknown)}; known: {', '.join(_SIM_OPTIONS)}, {_SIM_EXAMPLE}"
            )
        gbps = _positive_float(options["h2d_gbps"], "h2d_gbps", text) if "h2d_gbps" in options else DEFAULT_H2D_GBPS
        sync = options.get("sync", "0")
        if sync not in ("0", "1"):
            raise ConfigError(f"bad device '{text}': sync must be 0 or 1, got '{sync}'; {_SIM_EXAMPLE}")
        queue = _positive_float(options["queue"], "queue", text) if "queue" in options else DEFAULT_SIM_QUEUE
        if queue != int(queue):
            raise ConfigError(f"bad device '{text}': queue must be a whole number of steps, got '{options['queue']}'; {_SIM_EXAMPLE}")
        launch = float(options["launch_ms"]) if "launch_ms" in options else DEFAULT_SIM_LAUNCH_MS
        return SimDevice(step_ms, gbps, sync=sync == "1", queue=int(queue), launch_ms=launch)
    raise ConfigError(f"unknown device '{text}': use cuda, cuda:N, cpu, or sim:STEP_MS ({_SIM_EXAMPLE})")


def default_device_spec() -> str:
    """``cuda`` when a GPU is present, else ``sim:290``: the article's A10G device bound (3.45 steps/s)."""
    return "cuda" if torch.cuda.is_available() else f"sim:{DEFAULT_SIM_STEP_MS:g}"
