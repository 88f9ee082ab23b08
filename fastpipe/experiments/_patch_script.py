"""Every candidate fix of a script's training loader, as a patch of the script: the patch writer run on a script alone.

Why: ``fastpipe fix -- python train.py`` measures the candidates inside the script and patches the best
(:func:`fastpipe.experiments._patch.write_patch` on the sites it recorded); this runs only the part that needs no
measuring, so the patches can be read (and tested) for any script in seconds: the script runs until its training
loader (the first the script takes ``batches`` batches from) has delivered them, its sites recorded, then stops; the
candidates are built from its live loader as ``fix`` builds them, and each is written as a patch.

    python -m fastpipe.experiments._patch_script -- python train.py ARGS
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from fastpipe._command import parse_python_command
from fastpipe.experiments._fix_candidates import Candidate, build_candidates
from fastpipe.experiments._patch import Patch, write_patch
from fastpipe.experiments._sites import SiteRecorder
from fastpipe.monitor import tap_dataloaders
from fastpipe.workloads._workload import Workload


class _Stop(BaseException):
    """Raised from the training loader's ``next()`` once it has delivered its batches: the script ends there."""


def run_until_loader(kind: str, target: str, args: list[str], batches: int = 2) -> tuple[SiteRecorder, DataLoader | None]:
    """Run the script (``kind`` "path" or "module") until a DataLoader has delivered ``batches`` batches; the recorder
    of its sites and that loader (None when the script ended first)."""
    found: list[DataLoader] = []

    def source(loader: DataLoader, original: Callable[[DataLoader], Iterator[Any]]) -> Iterator[Any]:
        for count, batch in enumerate(original(loader), start=1):
            yield batch
            if count >= batches:
                found.append(loader)
                raise _Stop

    from fastpipe.monitor import Watch

    def select(loader: DataLoader) -> Any:
        return Watch(loader, echo=False, memory=False, hint=False)

    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [target, *args]
    sys.path.insert(0, str(Path(target).resolve().parent) if kind == "path" else os.getcwd())
    recorder = SiteRecorder(target if kind == "path" else Path(os.getcwd()) / "__main__.py")
    modules = set(sys.modules)
    try:
        with recorder, tap_dataloaders(select, source):
            try:
                if kind == "path":
                    runpy.run_path(target, run_name="__main__")
                else:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
            except _Stop:
                pass
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name in set(sys.modules) - modules:  # the script's own modules: a later run of another copy imports its own
            path = getattr(sys.modules[name], "__file__", None)
            if path and recorder.is_users(path):
                del sys.modules[name]
    return recorder, found[0] if found else None


def patches_for_script(kind: str, target: str, args: list[str], batches: int = 2) -> list[tuple[Candidate, Patch]]:
    """Each candidate fix of the script's training loader and its patch (no fix measured; none applied)."""
    recorder, loader = run_until_loader(kind, target, args, batches)
    if loader is None:
        return []
    original = Workload(loader=loader, step=lambda batch: None, name=Path(target).name)
    candidates, _ = build_candidates(original)
    sites = recorder.sites(loader)
    return [(candidate, write_patch(target, original, candidate, sites)) for candidate in candidates]


def main(argv: list[str] | None = None) -> int:
    kind, target, args = parse_python_command(
        sys.argv[1:] if argv is None else argv,
        no_script="usage: python -m fastpipe.experiments._patch_script -- python train.py ARGS",
        no_module="`python -m` needs a module name",
    )
    for candidate, patch in patches_for_script(kind, target, args):
        print(patch.text() if candidate.workload is not None else f"Patch for: {candidate.name}\n  not tried: {candidate.not_tried}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
