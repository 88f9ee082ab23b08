"""The advice's one type and the stage kinds: shared by every remedy module, so none imports another for them."""

from __future__ import annotations

from dataclasses import dataclass

RAW, TRANSFORM, COLLATE, COPY, WORKERS = "raw load", "transform", "collate/IPC", "host-to-device copy", "too few workers"


@dataclass(frozen=True)
class Advice:
    """One recommendation for one stage.

    Attributes:
        summary: one line: the stage's own remedy and fastpipe's drop-in for it.
        snippet: Python that applies the drop-in (using the script's ``root``, ``loader``, ``device``,
            ``step``), or None where no code fits every case.
        caveat: when the drop-in cannot help, or what fastpipe could not check; None when nothing applies.
    """

    summary: str
    snippet: str | None = None
    caveat: str | None = None

    def text(self) -> str:
        """Summary and caveat as one string, for a report's recommendation field."""
        return self.summary if self.caveat is None else f"{self.summary} Caveat: {self.caveat}"
