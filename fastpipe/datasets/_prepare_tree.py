"""What ``fastpipe prepare`` reads and where it may write: the source's files, the places checked, the listing compared.

Why each check: the prepared folder is what the user trains on, so it must list the very classes and files
``torchvision.datasets.ImageFolder(source)`` lists (labels are class indices: a class dropped shifts every later
label), and making it must never change the source.

* The walk follows symlinked folders, as torchvision's ``make_dataset`` (``os.walk(followlinks=True)``) and
  ``find_classes`` (``DirEntry.is_dir()``) do, and refuses a symlink loop (torchvision would walk it forever).
* A target inside the source (or inside a folder a source symlink points to) would become a class of the
  source's own ``ImageFolder``; a source inside the target would be copied into itself: both are refused,
  by real paths, before anything is written.
* A target that is a file, lies under a file or cannot be created is one line, not a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fastpipe.errors import ConfigError

#: Beside the target, the folder a run writes into; renamed to the target only when every file is in place.
PARTIAL_SUFFIX = ".fastpipe-partial"
#: A file being written, renamed to its own name once complete (so a resumed run never keeps half a file).
TMP_SUFFIX = ".fastpipe-tmp"


@dataclass
class SourceTree:
    """The source's regular files (relative paths, symlinks followed), its real folders, and its broken links."""

    files: list[Path] = field(default_factory=list)
    real_dirs: list[Path] = field(default_factory=list)
    broken_links: list[Path] = field(default_factory=list)


def walk_source(source: Path) -> SourceTree:
    """Every file under ``source``, sorted, following symlinked folders as torchvision does; a loop is an error."""
    tree = SourceTree()

    def visit(folder: Path, relative: Path, ancestors: tuple[Path, ...]) -> None:
        real = Path(os.path.realpath(folder))
        if real in ancestors:
            raise ConfigError(f"prepare: {folder} is a symlink to {real}, a folder above it (a loop); remove the link")
        tree.real_dirs.append(real)
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=True):
                    visit(Path(entry.path), relative / entry.name, (*ancestors, real))
                elif entry.is_file(follow_symlinks=True):
                    tree.files.append(relative / entry.name)
                elif entry.is_symlink():
                    tree.broken_links.append(relative / entry.name)

    visit(source, Path(), ())
    return tree


def partial_folder(target: Path) -> Path:
    """Where a run into ``target`` writes until it is complete: a hidden folder beside it (same file system)."""
    return target.parent / f".{target.name}{PARTIAL_SUFFIX}"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_places(source: Path, target: Path, tree: SourceTree) -> None:
    """Refuse, in one line, a target this run must not or cannot write (nothing is created here)."""
    real_target = Path(os.path.realpath(target))
    real_source = Path(os.path.realpath(source))
    for folder in tree.real_dirs:
        if _inside(real_target, folder):
            where = "" if folder == real_source else f" (through a symlinked folder, {folder})"
            raise ConfigError(
                f"prepare: the target {target} is inside the source {source}{where}: its copies would be read as more "
                "classes of the source; give a target outside it"
            )
        if _inside(folder, real_target):
            raise ConfigError(f"prepare: the source {source} is inside the target {target}; give a target outside the source")
    try:
        _check_target(target)
    except OSError as exc:  # a name too long, a permission denied on the way
        raise ConfigError(f"prepare: the target {target} cannot be made: {exc.strerror or exc}") from None


def _check_target(target: Path) -> None:
    """A target that is a file, a broken link, a full folder, or under a file or an unwritable folder."""
    if target.is_symlink() and not target.exists():
        raise ConfigError(f"prepare: the target {target} is a broken symlink; remove it or give a new folder")
    if target.exists() and not target.is_dir():
        raise ConfigError(f"prepare: the target {target} is a file; give a new folder")
    if target.is_dir() and any(target.iterdir()):
        raise ConfigError(f"prepare: {target} exists and is not empty; give a new folder")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"prepare: the target {target} cannot be made: {parent} is a file")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(f"prepare: the target {target} cannot be made: {parent} is not writable")
            break


def make_folder(path: Path, target: Path) -> None:
    """``mkdir -p path``, with an OSError as one line that names the target."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"prepare: the target {target} cannot be made: {exc.strerror or exc} ({exc.filename or path})") from None


def image_folder_listing(root: Path) -> tuple[list[str], list[tuple[str, int]]] | None:
    """``ImageFolder(root)``'s classes and (relative path, label) pairs, by torchvision's own functions; None
    when ``root`` has no class folders (not an ImageFolder layout: nothing to compare)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    try:
        classes, class_to_idx = find_classes(str(root))
    except FileNotFoundError:
        return None
    samples = make_dataset(str(root), class_to_idx, IMG_EXTENSIONS, allow_empty=True)
    return classes, [(os.path.relpath(path, root), label) for path, label in samples]


def check_same_listing(source: Path, prepared: Path, target: Path) -> None:
    """Fail loudly unless ``ImageFolder`` lists the same classes and files in ``prepared`` as in ``source``."""
    want, got = image_folder_listing(source), image_folder_listing(prepared)
    if want == got:
        return
    if want is None or got is None:
        raise ConfigError(f"prepare: {source} and the copy for {target} do not both hold class folders; the copy is left in {prepared}")
    if want[0] != got[0]:
        missing = sorted(set(want[0]) - set(got[0])) or sorted(set(got[0]) - set(want[0]))
        raise ConfigError(f"prepare: the copy's classes differ from the source's (e.g. {missing[:3]}); the copy is left in {prepared}")
    missing = sorted(set(want[1]) ^ set(got[1]))
    raise ConfigError(
        f"prepare: the copy lists {len(got[1])} files where the source lists {len(want[1])} (e.g. {missing[:3]}); "
        f"the copy is left in {prepared}"
    )
