"""Importing Ray lazily, with an error that says how to install it.

fastpipe's core never needs Ray, and ``fastpipe.workloads.toy`` registers ``toy:ray`` at import time, so
nothing here may import Ray until a Ray loader is actually built or iterated.
"""

from __future__ import annotations

from types import ModuleType

from fastpipe.errors import OptionalDependencyError

INSTALL_HINT = "pip install 'fastpipe[ray]'"


def require_ray() -> ModuleType:
    """The ``ray`` module with Ray Data loaded, or an OptionalDependencyError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data is an extra of ray itself)
    except ImportError as exc:
        raise OptionalDependencyError(
            f"the Ray data servers need Ray Data, which is not installed ({exc}); install it with {INSTALL_HINT}"
        ) from exc
    return ray


def require_ray_torch() -> ModuleType:
    """Like :func:`require_ray`, and also checks what ``iter_torch_batches`` imports (pydantic, via ray.train)."""
    ray = require_ray()
    try:
        import ray.train.torch  # noqa: F401  iter_torch_batches imports it for its device="auto" logic
    except ImportError as exc:
        raise OptionalDependencyError(
            f"Ray Data's iter_torch_batches needs Ray's 'train' extra ({exc}); install it with {INSTALL_HINT}"
        ) from exc
    return ray
