"""``{fastpipe-cli}`` directive: a subcommand's ``--help`` text, printed by its own argparse parser at build time.

The command-line page is written from ``fastpipe.cli.build_parser()`` on every build, so a flag added to a
parser is documented by the next build and a removed one disappears: the page cannot drift from the code.
Usage in a MyST page::

    ```{fastpipe-cli} diagnose
    ```

With no argument it prints the top-level ``fastpipe --help``. An unknown subcommand fails the build.
"""

from __future__ import annotations

from typing import Any

from cli_text import help_text
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class FastpipeCli(SphinxDirective):
    """Insert ``fastpipe COMMAND --help`` as a literal block."""

    optional_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        command = self.arguments[0] if self.arguments else None
        try:
            text = help_text(command)
        except ValueError as exc:
            raise self.error(str(exc)) from exc
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("fastpipe-cli", FastpipeCli)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
