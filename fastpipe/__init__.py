"""fastpipe: find and fix GPU starvation in PyTorch training input pipelines.

The public API. Everything below is re-exported from the package that owns it (see ARCHITECTURE.md):
``diagnosis`` (the cache ladder and its report), ``experiments`` (compare, tune), ``loading`` (prefetcher,
recycled batch memory), ``monitor`` (watch), ``workloads`` (Workload and the reference pipelines), ``transforms``, ``stages``,
``devices`` and ``errors``.
"""

from fastpipe.devices import CpuDevice, CudaDevice, Device, SimDevice, default_device_spec, parse_device
from fastpipe.diagnosis import (
    Advice,
    DiagnoseOptions,
    Measurement,
    MeasureOptions,
    Report,
    StageCosts,
    StepCheck,
    TransformFacts,
    check_step,
    check_stream,
    diagnose,
    explain_saturation,
    facts_for,
    find_pipeline,
    measure_stage_costs,
    measure_startup,
    measure_workload,
    recommend,
)
from fastpipe.errors import (
    ConfigError,
    DeviceUnavailableError,
    ExtensionUnavailableError,
    FastpipeError,
    OptionalDependencyError,
    PipelineError,
)
from fastpipe.experiments import Comparison, FixReport, TuneResult, compare, fix, tune
from fastpipe.loading import DevicePrefetcher, RecycledLoader, make_prefetcher, recycled, release, releasing, unwrap_loader
from fastpipe.monitor import watch
from fastpipe.stages import Stages
from fastpipe.transforms.device import ConvertColorScale, Normalize
from fastpipe.workloads import Workload, default_device_for, load_workload

__version__ = "0.1.0"

__all__ = [
    "Advice",
    "Comparison",
    "ConfigError",
    "ConvertColorScale",
    "CpuDevice",
    "CudaDevice",
    "Device",
    "DevicePrefetcher",
    "DeviceUnavailableError",
    "DiagnoseOptions",
    "ExtensionUnavailableError",
    "FastpipeError",
    "FixReport",
    "MeasureOptions",
    "Measurement",
    "Normalize",
    "OptionalDependencyError",
    "PipelineError",
    "RecycledLoader",
    "Report",
    "SimDevice",
    "StageCosts",
    "Stages",
    "StepCheck",
    "TransformFacts",
    "TuneResult",
    "Workload",
    "check_step",
    "check_stream",
    "compare",
    "default_device_for",
    "default_device_spec",
    "diagnose",
    "explain_saturation",
    "facts_for",
    "find_pipeline",
    "fix",
    "load_workload",
    "make_prefetcher",
    "measure_stage_costs",
    "measure_startup",
    "measure_workload",
    "parse_device",
    "recommend",
    "recycled",
    "release",
    "releasing",
    "tune",
    "unwrap_loader",
    "watch",
]
