"""Without the frameworks the integrations say what to install; importing them never imports the framework."""

from __future__ import annotations

import importlib
import sys

import pytest

from fastpipe.errors import OptionalDependencyError


@pytest.mark.parametrize(
    "module, hidden, extra",
    [("fastpipe.integrations.lightning", "lightning.pytorch", "lightning"), ("fastpipe.integrations.hf", "transformers", "hf")],
)
def test_missing_framework_names_the_extra(monkeypatch: pytest.MonkeyPatch, module: str, hidden: str, extra: str) -> None:
    integration = importlib.import_module(module)
    monkeypatch.setitem(sys.modules, hidden, None)  # what an environment without the package gives: ImportError
    monkeypatch.setattr(integration, "_CALLBACK", None)
    with pytest.raises(OptionalDependencyError, match=rf"pip install 'fastpipe\[{extra}\]'"):
        integration.WatchCallback
    with pytest.raises(OptionalDependencyError, match=rf"fastpipe\[{extra}\]"):
        integration.diagnose(object(), object()) if extra == "lightning" else integration.diagnose(object())


def test_the_integrations_import_their_framework_only_inside_functions() -> None:
    """No module-level import of lightning or transformers: importing fastpipe never pulls them in."""
    import ast
    from pathlib import Path

    import fastpipe.integrations

    for path in Path(fastpipe.integrations.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = [alias.name for node in top if isinstance(node, ast.Import) for alias in node.names]
        names += [node.module or "" for node in top if isinstance(node, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning", "transformers", "accelerate")], path
