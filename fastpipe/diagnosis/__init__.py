"""The diagnosis engine: the cache ladder, stage costs measured in the workers, and the report.

Lives here: planning cache points, measuring them, attributing time to stages, wording advice, and the
checks around a run (step check, noise, CPU, DDP agreement). It may import the base modules, ``ops``,
``transforms``, ``datasets``, ``loading``, ``distributed`` and ``workloads``; never ``experiments`` or the CLI.
"""

from fastpipe.diagnosis._advice import Advice, recommend
from fastpipe.diagnosis._diagnose import diagnose
from fastpipe.diagnosis._discovery import find_pipeline
from fastpipe.diagnosis._measure import Measurement, measure_workload
from fastpipe.diagnosis._report import Report
from fastpipe.diagnosis._stepcheck import StepCheck, check_step
from fastpipe.diagnosis.stagecost import StageCosts, explain_saturation, measure_stage_costs

__all__ = [
    "Advice",
    "Measurement",
    "Report",
    "StageCosts",
    "StepCheck",
    "check_step",
    "diagnose",
    "explain_saturation",
    "find_pipeline",
    "measure_stage_costs",
    "measure_workload",
    "recommend",
]
