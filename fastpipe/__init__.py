"""fastpipe: find and fix GPU starvation in PyTorch training input pipelines.

The public API a user types, by task: :func:`diagnose` a pipeline (tuned by :class:`DiagnoseOptions` and
:class:`MeasureOptions`) into a :class:`Report`; :func:`watch` a real run; :func:`fix` it (a :class:`FixReport`),
:func:`compare` variants (a :class:`Comparison`) and :func:`tune` its loader; describe it as a :class:`Workload`; the
drop-ins most pipelines need (:class:`ThreadLoader`, :class:`DevicePrefetcher`, :class:`Normalize`,
:class:`ConvertColorScale`); and the errors a caller catches (:class:`FastpipeError`, :class:`ConfigError`).

Everything else lives in the sub-package that owns it (see ARCHITECTURE.md): ``fastpipe.devices`` (``Device``,
``parse_device``...), ``fastpipe.diagnosis`` (``facts_for``, ``check_step``, ``measure_*``, ``find_pipeline``...),
``fastpipe.experiments`` (``TuneResult``), ``fastpipe.loading`` (``recycled``, ``release``, ``make_prefetcher``...),
``fastpipe.stages`` (``Stages``), ``fastpipe.workloads`` (``load_workload``...) and ``fastpipe.errors`` (every error).
The names that were importable from here before keep working for one release, with a ``DeprecationWarning`` that
names their new home.
"""

import importlib as _importlib
import warnings as _warnings

from fastpipe.datasets.threaded import ThreadLoader
from fastpipe.diagnosis import DiagnoseOptions, MeasureOptions, Report, diagnose
from fastpipe.errors import ConfigError, FastpipeError
from fastpipe.experiments import Comparison, FixReport, compare, fix, tune
from fastpipe.loading import DevicePrefetcher
from fastpipe.monitor import watch
from fastpipe.transforms.device import ConvertColorScale, Normalize
from fastpipe.workloads import Workload

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "ConfigError",
    "ConvertColorScale",
    "DevicePrefetcher",
    "DiagnoseOptions",
    "FastpipeError",
    "FixReport",
    "MeasureOptions",
    "Normalize",
    "Report",
    "ThreadLoader",
    "Workload",
    "compare",
    "diagnose",
    "fix",
    "tune",
    "watch",
]

#: The names that moved out of the top level (name: the sub-package to import it from); kept for one release.
_MOVED = {
    **dict.fromkeys(("CpuDevice", "CudaDevice", "Device", "SimDevice", "default_device_spec", "parse_device"), "fastpipe.devices"),
    **dict.fromkeys(
        (
            "Advice",
            "Measurement",
            "StageCosts",
            "StepCheck",
            "TransformFacts",
            "check_step",
            "check_stream",
            "explain_saturation",
            "facts_for",
            "find_pipeline",
            "measure_stage_costs",
            "measure_startup",
            "measure_workload",
            "recommend",
        ),
        "fastpipe.diagnosis",
    ),
    **dict.fromkeys(("DeviceUnavailableError", "ExtensionUnavailableError", "OptionalDependencyError", "PipelineError"), "fastpipe.errors"),
    "TuneResult": "fastpipe.experiments",
    **dict.fromkeys(("RecycledLoader", "make_prefetcher", "recycled", "release", "releasing", "unwrap_loader"), "fastpipe.loading"),
    "Stages": "fastpipe.stages",
    **dict.fromkeys(("default_device_for", "load_workload"), "fastpipe.workloads"),
}


def __getattr__(name: str) -> object:
    """A name that moved to a sub-package still resolves, for one release, with a warning that says where it lives now
    (so an old ``fastpipe.parse_device`` or ``from fastpipe import recycled`` keeps running while it is updated)."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'fastpipe' has no attribute {name!r}")
    _warnings.warn(f"fastpipe.{name} moved: import it from {home}", DeprecationWarning, stacklevel=2)
    return getattr(_importlib.import_module(home), name)
