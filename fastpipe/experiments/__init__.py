"""Experiments built on the diagnosis engine: ``compare`` (variants side by side), ``tune`` (loader settings) and
``fix`` (the fixes that apply to a pipeline, each measured against it and its input checked).

Lives here: whatever runs the engine's point measurement several times and weighs the results against each
other. It may import everything below it (``diagnosis``, ``workloads``, ``loading`` and the base modules);
only the CLI and the top-level package import it.
"""

from fastpipe.experiments._compare import Comparison, VariantResult, compare
from fastpipe.experiments._fix import FixReport, FixResult, fix
from fastpipe.experiments._tune import tune
from fastpipe.experiments._tune_result import Trial, TuneResult

__all__ = ["Comparison", "FixReport", "FixResult", "Trial", "TuneResult", "VariantResult", "compare", "fix", "tune"]
