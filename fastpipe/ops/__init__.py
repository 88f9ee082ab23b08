"""fastpipe's C++ ops (``torch.ops.fastpipe.*``), loaded if the extension was built.

Like torchvision's ``extension.py``: a missing or broken library sets
``EXTENSION_AVAILABLE = False`` instead of failing the import, and only a call that needs
an op raises, with a message that says how to rebuild.
"""
from __future__ import annotations

from fastpipe.errors import ExtensionUnavailableError

EXTENSION_LOAD_ERROR: BaseException | None = None
try:
    import torch  # noqa: F401  (the library links against libtorch, which must be loaded first)

    from fastpipe import _C  # noqa: F401  (importing it runs the TORCH_LIBRARY registrations)

    EXTENSION_AVAILABLE = True
except (ImportError, OSError) as exc:
    EXTENSION_AVAILABLE = False
    EXTENSION_LOAD_ERROR = exc


def require_extension() -> None:
    """Raise a clear error if the C++ library is not loaded."""
    if not EXTENSION_AVAILABLE:
        raise ExtensionUnavailableError(
            "fastpipe's C++ ops are not available "
            f"({type(EXTENSION_LOAD_ERROR).__name__}: {EXTENSION_LOAD_ERROR}). "
            "Rebuild them against your torch with: pip install --no-build-isolation -e . "
            "(needs a C++ compiler), or use backend='numba' / 'numpy'"
        )


def ping(x: "torch.Tensor") -> "torch.Tensor":
    """The trivial op that proves the library loads (returns a copy of ``x``)."""
    require_extension()
    return torch.ops.fastpipe.ping(x)
