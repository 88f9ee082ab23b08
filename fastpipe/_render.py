"""Shared plain-text and picture rendering for fastpipe's result objects.

Reports, comparisons, stage costs and tuner results all print a title, a rich table and
a few lines; and plots need matplotlib, which is optional.
"""

from __future__ import annotations

import io
from typing import Any, Iterable, Sequence

from fastpipe.errors import OptionalDependencyError


def render_table(
    title: str, columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[str]], lines: Iterable[str] = (), width: int = 120
) -> str:
    """A titled rich table followed by ``lines``, rendered as plain text. ``columns`` are (header, justify)."""
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for header, justify in columns:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False, color_system=None)
    console.print(title, highlight=False, markup=False)
    console.print(table)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)  # the terminal wraps; tables stay intact
    return buffer.getvalue()


#: One colour language for every fastpipe picture.
COLORS = {
    "device": "#2c7fb8",  # the device's own time: the bound
    "cost": "#d95f02",  # a stage named as costing time
    "unresolved": "#fdb863",  # a cost that did not hold when remeasured
    "minor": "#bdbdbd",  # within noise or the threshold: not named; a rung with no gain beyond noise
    "gain": "#1b9e77",  # a rung that saved time beyond noise
    "reference": "#636363",  # the rung others are compared with
}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a clear error saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise OptionalDependencyError("plotting needs matplotlib: pip install 'fastpipe[plot]'") from exc
    return plt
