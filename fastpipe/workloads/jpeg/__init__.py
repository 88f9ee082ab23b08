"""The real-JPEG reference workloads (``jpeg:naive``, ``jpeg:optimized``, ...) on a real-photo corpus.

``fastpipe.workloads._workload.load_workload`` calls :func:`make_workload` for ``jpeg:`` SPECs and reads
:data:`DEFAULT_SIM_SPEC` for the device they get when none is given and no GPU is present.
"""

from fastpipe.workloads.jpeg.workloads import (
    BATCH_SIZE,
    DEFAULT_SIM_SPEC,
    IMG_SIZE,
    JPEG_SIM_STEP_MS,
    LADDER,
    VARIANTS,
    make_jpeg_variant,
    make_workload,
    usual_recipe,
)

__all__ = [
    "BATCH_SIZE",
    "DEFAULT_SIM_SPEC",
    "IMG_SIZE",
    "JPEG_SIM_STEP_MS",
    "LADDER",
    "VARIANTS",
    "make_jpeg_variant",
    "make_workload",
    "usual_recipe",
]
