"""Without the frameworks the integrations say what to install; importing them never imports the framework."""
from __future__ import annotations

import importlib
import sys

import pytest

from fastpipe.errors import OptionalDependencyError


@pytest.mark.parametrize("module, hidden, extra", [("fastpipe.integrations.lightning", "lightning.pytorch", "lightning"),
                                                   ("fastpipe.integrations.hf", "transformers", "hf")])
def test_missing_framework_names_the_extra(monkeypatch: pytest.MonkeyPatch, module: str, hidden: str, extra: str) -> None:
    integration = importlib.import_module(module)
    monkeypatch.setitem(sys.modules, hidden, None)  # what an environment without the package gives: ImportError
    monkeypatch.setattr(integration, "_CALLBACK", None)
    with pytest.raises(OptionalDependencyError, match=rf"pip install 'fastpipe\[{extra}\]'"):
        integration.WatchCallback
    with pytest.raises(OptionalDependencyError, match=rf"fastpipe\[{extra}\]"):
        integration.diagnose(object(), object()) if extra == "lightning" else integration.diagnose(object())


def test_importing_fastpipe_does_not_import_the_frameworks() -> None:
    import subprocess

    code = ("import sys, fastpipe, fastpipe.integrations.lightning, fastpipe.integrations.hf; "
            "print(any(m in sys.modules for m in ('lightning', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
