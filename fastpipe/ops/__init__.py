"""fastpipe's C++ ops (``torch.ops.fastpipe.*``), loaded if the extension was built.

Like torchvision's ``extension.py``: a missing or broken library sets
``EXTENSION_AVAILABLE = False`` instead of failing the import, and only a call that needs
an op raises, with a message that says how to rebuild. The library is loaded from its file
(:mod:`fastpipe.ops._load`), so importing this package before ``fastpipe`` itself loads it too.
Every wrapper refuses a non-CPU tensor before dispatch (:mod:`fastpipe.ops._device`). The typed
wrappers and fake kernels live in :mod:`fastpipe.ops.mask`.
"""

from __future__ import annotations

from fastpipe.errors import ExtensionUnavailableError

EXTENSION_LOAD_ERROR: BaseException | None = None
try:
    import torch  # noqa: F401  (the library links against libtorch, which must be loaded first)

    from fastpipe.ops._load import load_extension

    load_extension("_C")  # loading it runs the TORCH_LIBRARY registrations; by path, whatever the import order

    EXTENSION_AVAILABLE = True
except (ImportError, OSError) as exc:
    EXTENSION_AVAILABLE = False
    EXTENSION_LOAD_ERROR = exc


def extension_status() -> str:
    """One line for reports and skip reasons: loaded, or why not."""
    if EXTENSION_AVAILABLE:
        return "fastpipe._C loaded"
    return f"fastpipe._C not loaded ({type(EXTENSION_LOAD_ERROR).__name__}: {EXTENSION_LOAD_ERROR})"


def require_extension() -> None:
    """Raise a clear error if the C++ library is not loaded."""
    if not EXTENSION_AVAILABLE:
        raise ExtensionUnavailableError(
            f"fastpipe's C++ ops are not available ({extension_status()}). "
            "Rebuild them against your torch with: pip install --no-build-isolation -e . "
            "(needs a C++ compiler), or use backend='numba' / 'numpy'"
        )


from fastpipe.ops.jpeg import (  # noqa: E402  (its own library and load flag, fastpipe._jpeg)
    JPEG_OP_AVAILABLE,
    CorruptImageError,
    DecompressionBombError,
    decode_jpeg_crop,
    jpeg_op_status,
    jpeg_size,
    max_image_pixels,
    set_max_image_pixels,
    which_decoder,
)
from fastpipe.ops.jpeg_batch import decode_jpeg_crop_batch  # noqa: E402  (registers the batch op's fake kernels)
from fastpipe.ops.mask import apply_mask_, draw_mask, random_mask_, random_mask_out  # noqa: E402  (needs the flags above)

__all__ = [
    "EXTENSION_AVAILABLE",
    "EXTENSION_LOAD_ERROR",
    "extension_status",
    "require_extension",
    "draw_mask",
    "apply_mask_",
    "random_mask_",
    "random_mask_out",
    "JPEG_OP_AVAILABLE",
    "CorruptImageError",
    "DecompressionBombError",
    "decode_jpeg_crop",
    "decode_jpeg_crop_batch",
    "jpeg_op_status",
    "jpeg_size",
    "max_image_pixels",
    "set_max_image_pixels",
    "which_decoder",
]
