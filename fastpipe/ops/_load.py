"""Load fastpipe's compiled extensions (``fastpipe._C``, ``fastpipe._jpeg``) from their files, never through the package.

``from fastpipe import _C`` asks the ``fastpipe`` package for an attribute. When ``fastpipe.ops`` is imported
first (``import fastpipe.ops`` in a test module run alone), ``fastpipe/__init__.py`` is still running when the
ops load, and a failed submodule look-up there surfaces as "cannot import name '_C' from partially
initialized module 'fastpipe' (most likely due to a circular import)", which hides the real reason, and
the ops are off for the whole process. Loading the shared library from its path through importlib's
extension loader does not depend on the package's state (nor on ``sys.path`` or import order); only
where no file is found next to the package (an install that put it elsewhere) is the import system asked.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The package folder the extensions are built into (``setup.py build_ext --inplace``, or a wheel).
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def extension_path(name: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The file of extension ``name`` (e.g. ``"_C"``) for this interpreter, or None when none is built for it."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = package_dir / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def load_extension(name: str, package_dir: Path = PACKAGE_DIR) -> ModuleType:
    """Import ``fastpipe.<name>`` from its shared library, running its operator registrations once per process.

    Raises:
        ImportError: no file for this interpreter (the message names files built for another one) and the
            import system cannot find it either, or the library failed to load (``OSError`` from the loader,
            e.g. an undefined symbol from a torch it was not built against, is re-raised as is).
    """
    full = f"fastpipe.{name}"
    loaded = sys.modules.get(full)
    if loaded is not None:
        return loaded
    path = extension_path(name, package_dir)
    if path is None:
        try:
            return importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise
            others = sorted(p.name for p in package_dir.glob(f"{name}.*") if p.suffix in (".so", ".pyd"))
            wanted = importlib.machinery.EXTENSION_SUFFIXES[0]
            hint = f"; found {', '.join(others)}, built for another Python" if others else "; it was not built"
            raise ImportError(f"no {name}{wanted} in {package_dir}{hint}", name=full) from None
    spec = importlib.util.spec_from_file_location(full, path)
    assert spec is not None and spec.loader is not None  # a file with an extension suffix always has a loader
    module = importlib.util.module_from_spec(spec)  # runs PyInit, which runs the TORCH_LIBRARY registrations
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(full, None)
        raise
    package = sys.modules.get("fastpipe")
    if package is not None:
        setattr(package, name, module)
    return module
