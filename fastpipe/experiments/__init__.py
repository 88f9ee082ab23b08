"""Experiments built on the diagnosis engine: ``compare`` (variants side by side), ``tune`` (loader settings) and
``fix`` (the fixes that apply to a pipeline, each measured against it and its input checked).

Lives here: whatever runs the engine's point measurement several times and weighs the results against each
other. It may import everything below it (``diagnosis``, ``workloads``, ``loading`` and the base modules);
only the CLI and the top-level package import it.
"""

from fastpipe.experiments._compare import Comparison, compare
from fastpipe.experiments._fix import FixReport, fix
from fastpipe.experiments._tune import TuneResult, tune

__all__ = ["Comparison", "FixReport", "TuneResult", "compare", "fix", "tune"]
