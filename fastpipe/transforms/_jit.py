"""The one switch that turns Numba compilation off, for debugging and for tests of the Python path.

Like ffcv's ``Compiler``: every kernel is written once, as plain Python that Numba can
compile, and decorated with :func:`jit`. Set ``FASTPIPE_DISABLE_JIT=1`` before importing
fastpipe and the kernels stay plain Python (slow, but steppable in a debugger and free of
Numba's typing rules). The compiled kernels keep their Python source as ``.py_func``, which
is how the tests exercise the plain path without a subprocess.
"""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: True when ``FASTPIPE_DISABLE_JIT=1`` was set at import time.
JIT_DISABLED: bool = os.environ.get("FASTPIPE_DISABLE_JIT", "") == "1"


def jit(fn: F) -> F:
    """``numba.njit(nogil=True, cache=True)``, or ``fn`` itself when JIT is disabled.

    ``nogil`` lets threads (a thread-based loader, the prefetcher) run kernels in parallel;
    ``cache`` writes the machine code next to the module so DataLoader workers and later
    runs skip the compile.
    """
    if JIT_DISABLED:
        return fn
    import numba  # deferred: numba's import costs ~0.3 s, paid only by code that needs a kernel

    return numba.njit(nogil=True, cache=True)(fn)


def python_impl(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The plain-Python function behind a kernel, compiled or not."""
    return getattr(fn, "py_func", fn)
