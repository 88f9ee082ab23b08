"""Sphinx configuration for fastpipe's documentation (``make docs``; MyST Markdown pages, furo theme).

The API pages are autodoc of the public modules; the command-line page is the parsers' own ``--help``, made at
build time by ``_ext/cli_help.py``, so neither can drift from the code. The build runs with ``-W``: a broken
cross-reference or a docstring that does not parse fails it.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # this checkout's fastpipe, not an installed one
sys.path.insert(0, str(DOCS / "_ext"))

project = "fastpipe"
author = "the fastpipe developers"
copyright = "the fastpipe developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "cli_help",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

myst_enable_extensions = ["colon_fence", "deflist"]  # deflist: the glossary of how-it-works.md
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve, and broken ones warn (so fail under -W)

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
autosummary_generate = False  # the tables link to the autodoc entries on the same page
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "fastpipe"
html_static_path = ["_static"]
# wide code: Python and shell lines wrap, console output scrolls with a visible scrollbar (furo's column is 46em)
html_css_files = ["wide-code.css"]
