"""The diagnosis engine: the cache ladder, stage costs measured in the workers, and the report.

Lives here: planning cache points, measuring them, attributing time to stages, wording advice, and the
checks around a run (step check, noise, CPU, DDP agreement). It may import the base modules, ``ops``,
``transforms``, ``datasets``, ``loading``, ``distributed`` and ``workloads``; never ``experiments`` or the CLI.
"""

from fastpipe.diagnosis._diagnose import diagnose
from fastpipe.diagnosis._options import DiagnoseOptions, MeasureOptions, TrainState
from fastpipe.diagnosis._stepcheck import StepCheck, check_step
from fastpipe.diagnosis.discovery._catalog import TransformFacts, facts_for
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._measure import Measurement, measure_workload
from fastpipe.diagnosis.ladder._results import ExperimentResult, Unavailable
from fastpipe.diagnosis.stagecost import StageCosts, measure_stage_costs
from fastpipe.diagnosis.unseen._startup import measure_startup
from fastpipe.diagnosis.unseen._streams import check_stream
from fastpipe.diagnosis.verdict._advice import Advice, recommend
from fastpipe.diagnosis.verdict._report import Bottleneck, Report
from fastpipe.diagnosis.verdict._saturation import explain_saturation

__all__ = [
    "Advice",
    "Bottleneck",
    "DiagnoseOptions",
    "ExperimentResult",
    "MeasureOptions",
    "Measurement",
    "Report",
    "StageCosts",
    "StepCheck",
    "TrainState",
    "TransformFacts",
    "Unavailable",
    "check_step",
    "check_stream",
    "diagnose",
    "explain_saturation",
    "facts_for",
    "find_pipeline",
    "measure_stage_costs",
    "measure_startup",
    "measure_workload",
    "recommend",
]
