"""fastpipe: find and fix GPU starvation in PyTorch training input pipelines."""
from fastpipe.advice import Advice, recommend
from fastpipe.compare import Comparison, compare
from fastpipe.diagnose import diagnose
from fastpipe.devices import CpuDevice, CudaDevice, Device, SimDevice, default_device_spec, parse_device
from fastpipe.errors import (
    ConfigError,
    DeviceUnavailableError,
    ExtensionUnavailableError,
    FastpipeError,
    OptionalDependencyError,
    PipelineError,
)
from fastpipe.measure import Measurement, measure_workload
from fastpipe.prefetch import DevicePrefetcher, make_prefetcher
from fastpipe.recycle import RecycledLoader, recycled, release, releasing
from fastpipe.report import Report
from fastpipe.stagecost import StageCosts, explain_saturation, measure_stage_costs
from fastpipe.discovery import find_pipeline
from fastpipe.stages import Stages
from fastpipe.stepcheck import StepCheck, check_step
from fastpipe.transforms.device import ConvertColorScale, Normalize
from fastpipe.tune import TuneResult, tune
from fastpipe.workload import Workload, default_device_for, load_workload

__version__ = "0.1.0"

__all__ = [
    "measure_stage_costs",
    "StageCosts",
    "explain_saturation",
    "tune",
    "TuneResult",
    "Normalize",
    "ConvertColorScale",
    "recycled",
    "RecycledLoader",
    "release",
    "releasing",
    "Stages",
    "find_pipeline",
    "Advice",
    "recommend",
    "StepCheck",
    "check_step",
    "default_device_for",
    "DevicePrefetcher",
    "make_prefetcher",
    "compare",
    "Comparison",
    "diagnose",
    "Report",
    "Device",
    "CpuDevice",
    "CudaDevice",
    "SimDevice",
    "parse_device",
    "default_device_spec",
    "FastpipeError",
    "ConfigError",
    "DeviceUnavailableError",
    "ExtensionUnavailableError",
    "OptionalDependencyError",
    "PipelineError",
    "Measurement",
    "measure_workload",
    "Workload",
    "load_workload",
]
