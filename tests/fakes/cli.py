"""Command lines for the CLI tests of the ladder's commands (``diagnose``, ``costs``, ``tune``) on ``toy:naive``.

Why one builder: each of those tests runs the real command end to end on a workload kept tiny (2 timed steps after 1
warm-up, batches of 2 images of 32 px read from 64 px), and the sizes that keep it to seconds belong in one place.
"""

from __future__ import annotations

#: The flags that keep a toy run to seconds: few steps, small batches of small images.
TINY = ["--steps", "2", "--warmup", "1", "--batch-size", "2", "--raw-size", "64", "--img-size", "32"]


def tiny_toy_argv(command: str, device: str, *flags: str) -> list[str]:
    """``fastpipe COMMAND toy:naive --device DEVICE`` with the :data:`TINY` sizes, then the test's own ``flags``."""
    return [command, "toy:naive", "--device", device, *TINY, *flags]
