"""Variable inputs: do the first samples differ in size? Then one cached sample cannot stand for all.

Only the raw load runs, in the main process: the probe transform stops each sample before any
transform, so a slow or hanging transform cannot hold the diagnosis up.
"""

from __future__ import annotations

from typing import Any

from fastpipe.diagnosis.ladder._points import PointRunner


class _Captured(BaseException):
    """Raised by the probe transform to stop a sample right after its raw input is seen (BaseException:
    a dataset's own ``except Exception`` must not swallow it)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def _capture_raw(value: Any) -> Any:
    raise _Captured(value)


def variable_inputs(runner: PointRunner, samples: int = 6) -> str | None:
    """Why the inputs look variable (raw sizes differ among the first samples), or None.

    Only the raw load runs here, in the main process: the probe transform stops each sample
    before any transform, so a slow or hanging transform cannot hold the diagnosis up.
    """
    dataset = runner.workload.loader.dataset
    try:
        length = len(dataset)
    except TypeError:
        return None
    pipeline = runner.pipeline
    probe = pipeline.with_transform(dataset, _capture_raw) if pipeline is not None and pipeline.stages else None
    sizes = set()
    for index in range(min(samples, length)):
        try:
            value = dataset[index] if probe is None else probe[index]
        except _Captured as captured:
            value = captured.value
        except Exception:
            return None
        sizes.add(_size_of(value))
    return f"the first {min(samples, length)} samples differ in size ({len(sizes)} sizes)" if len(sizes) > 1 else None


def _size_of(value: Any) -> Any:
    if hasattr(value, "size") and not callable(value.size) and isinstance(value.size, tuple):  # PIL image
        return value.size
    if hasattr(value, "shape"):
        return tuple(value.shape)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return tuple(_size_of(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _size_of(v)) for k, v in value.items()))
    return type(value).__name__
