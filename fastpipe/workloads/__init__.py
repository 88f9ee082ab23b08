"""Workloads: a loader plus a training step on a device, and the reference ones (``toy:``, ``jpeg:``).

Lives here: :class:`Workload` and ``SPEC`` parsing (``_workload``), the article's toy pipeline (``toy``),
the real-photo JPEG pipelines (``jpeg``) and their corpus (``photos``). It may import the base modules,
``ops``, ``transforms``, ``datasets``, ``loading`` and ``distributed``; never ``diagnosis`` or above.
"""

from fastpipe.workloads._workload import Workload, default_device_for, load_workload

__all__ = ["Workload", "default_device_for", "load_workload"]
