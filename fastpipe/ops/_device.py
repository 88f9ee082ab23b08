"""The check every op wrapper makes before dispatch: fastpipe's C++ ops have CPU kernels only.

Without it a CUDA tensor reaches torch's dispatcher, whose error ("Could not run 'fastpipe::random_mask_' with
arguments from the 'CUDA' backend ...") runs to forty lines of registered backends and never says what to do.
"""

from __future__ import annotations

import torch

from fastpipe.errors import ConfigError


def require_cpu(op: str, **tensors: torch.Tensor) -> None:
    """Raise :class:`ConfigError` naming ``op`` and the argument when any of ``tensors`` is not a CPU tensor.

    Fake tensors under ``torch.compile`` report the device they stand for, so tracing a CPU pipeline passes.
    """
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
            raise ConfigError(
                f"fastpipe.ops.{op}: {name} must be a CPU tensor, got one on {tensor.device}; fastpipe's C++ ops run on the "
                f"CPU (in DataLoader workers): call it before the copy to the device, or on {name}.cpu()"
            )
