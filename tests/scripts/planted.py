"""The planted slow stage the test training scripts put in their transforms (imported from the scripts' own folder,
which ``python SCRIPT`` and script mode put first on ``sys.path``, as a user's script imports its helpers)."""

import time


class SlowFilter:
    """The planted stage: costs ``ms`` of waiting per sample (a slow filter reading a remote file, say)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, img):
        time.sleep(self.ms / 1000)
        return img
