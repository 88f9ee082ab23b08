"""fastpipe's exception types.

Every error a user can cause derives from :class:`FastpipeError`, so a caller (and the
CLI, which turns these into one-line messages and exit code 2) can tell "you asked for
something wrong" apart from a bug in fastpipe.
"""

from __future__ import annotations


class FastpipeError(Exception):
    """Base class for errors fastpipe raises on purpose, with a message that says what to fix."""


class ConfigError(FastpipeError, ValueError):
    """A bad argument or specification: a device string, a workload SPEC, an option value."""


class DeviceUnavailableError(FastpipeError, RuntimeError):
    """The requested device exists in principle but not on this machine (e.g. cuda without a GPU)."""


class ExtensionUnavailableError(FastpipeError, RuntimeError):
    """An op needs fastpipe's C++ library, which was not built or failed to load."""


class OptionalDependencyError(FastpipeError, ImportError):
    """An optional dependency (matplotlib, torchtnt, ray...) is missing; the message says how to install it."""


class PipelineError(FastpipeError, RuntimeError):
    """The user's pipeline failed while fastpipe ran it: a worker, a transform or the training step raised.

    Attributes:
        stage: where it happened, e.g. ``"after:RandomMask"`` or ``"step"``; ``None`` if unknown.
    """

    def __init__(self, message: str, stage: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage


class CorruptImageError(FastpipeError, OSError):
    """An image file that cannot be decoded: truncated, corrupt, or not an image. The message names the file."""


class DecompressionBombError(CorruptImageError):
    """An image whose header claims more pixels than the limit (:func:`fastpipe.ops.jpeg.set_max_image_pixels`).

    Refused before its pixels are allocated, as PIL refuses one with its own ``DecompressionBombError``.
    The message names the file, its size and the limit.
    """
