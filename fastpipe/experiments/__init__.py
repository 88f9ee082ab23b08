"""Experiments built on the diagnosis engine: ``compare`` (variants side by side) and ``tune`` (loader settings).

Lives here: whatever runs the engine's point measurement several times and weighs the results against each
other. It may import everything below it (``diagnosis``, ``workloads``, ``loading`` and the base modules);
only the CLI and the top-level package import it.
"""

from fastpipe.experiments._compare import Comparison, compare
from fastpipe.experiments._tune import TuneResult, tune

__all__ = ["Comparison", "TuneResult", "compare", "tune"]
