"""The options of a measurement and of a diagnosis (:class:`MeasureOptions`, :class:`DiagnoseOptions`) and the
training state a diagnosis puts back (:class:`TrainState`), where the entry points and the CLI import them from.

They are defined in :mod:`fastpipe.diagnosis.runtime._options`, the diagnosis's first phase, so that the runners of
the ladder (a later phase than this package's own modules) take the same objects.
"""

from fastpipe.diagnosis.runtime._options import STRATEGIES, DiagnoseOptions, MeasureOptions, TrainState, as_options

__all__ = ["STRATEGIES", "DiagnoseOptions", "MeasureOptions", "TrainState", "as_options"]
