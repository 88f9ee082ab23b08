"""Where a running script built its training loader, its dataset and its transform, and where its loop copies a batch
to the device: the places a patch of the script's own files must edit.

Why live frames and not only the AST: a script builds its loader in a function, from a dataset another function
returns, with a transform a class in a module beside it assembles (torchvision's ``train.py``, ``presets.py``); the
names alone do not say which of several calls made the objects the script trains on. So while the script runs,
:class:`SiteRecorder` keeps, for each object, the stack of the user's frames (files under the script's folder, not
torch's, torchvision's or fastpipe's) at the moment it was made:

* ``DataLoader.__init__`` (wrapped) for each loader, with the module namespace of each frame (a function the
  script calls, defined in a module beside it, is found through it);
* the first ``iter()`` of each loader (a :mod:`fastpipe.monitor` tap that selects nothing), for the loop that reads it.

Each frame carries the span of the call it was executing (``co_positions``), so the AST (:mod:`._source`) gives the
very ``Call`` node. :meth:`SiteRecorder.sites` then combines the two into :class:`Sites`: the loader's call, the
dataset's call (the loader call's ``dataset`` argument followed by name to its assignment, and through the
``return`` of a function of the user's files: torch's ``Dataset`` has no constructor of its own to wrap, and setting a
``__new__`` on it cannot be undone in CPython), and the copy to the device (the first ``x = x.to(...)`` /
``x.cuda()`` of a batch in the body of the ``for`` loop the loader is iterated by, or that loop's callers' loops, as
when a logger's generator wraps it). What cannot be found carries its reason in :attr:`Sites.why`.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader, Dataset

from fastpipe.experiments._source import SourceFile, Span, bindings_of, callee_name, dotted, own_nodes, returned
from fastpipe.monitor import close_tap, open_tap

_FASTPIPE = str(Path(__file__).resolve().parents[1])
FOLLOW_DEPTH = 6
"""How many names and returns the AST fallback follows from the loader call to the dataset's constructor."""


@dataclass(frozen=True)
class Frame:
    """One of the user's frames at the moment an object was made: its file and the span of the call it executed."""

    path: str
    span: Span
    function: str
    namespace: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """The frame's module globals: what a name the call uses resolves to."""

    def where(self, root: Path) -> str:
        return f"{_relative(self.path, root)}:{self.span[0]}"


def _relative(path: "str | Path", root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def _position(frame: FrameType) -> Span | None:
    """The span of the instruction ``frame`` is executing (CPython 3.11+: ``co_positions``)."""
    if frame.f_lasti < 0 or not hasattr(frame.f_code, "co_positions"):
        return None
    positions = next(itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None), None)
    if positions is None or None in positions:
        return None
    lineno, end_lineno, col, end_col = positions  # co_positions' order; a Span is ast's
    return (lineno, col, end_lineno, end_col)  # type: ignore[return-value]


class SiteRecorder:
    """Record creation sites while a script runs: ``with SiteRecorder(script): runpy.run_path(script)``.

    Args:
        script: the script's path; the user's files are those under its folder (or ``root``).
        root: the folder whose files count as the user's (default: the script's).

    Taps nest with script mode's and ``fastpipe watch``'s (the iteration tap is a :mod:`fastpipe.monitor` tap); the
    wrapped ``DataLoader.__init__`` is put back on exit unless someone patched over it.
    """

    def __init__(self, script: "str | os.PathLike[str]", root: "str | os.PathLike[str] | None" = None) -> None:
        self.script = Path(script).resolve()
        self.root = Path(root).resolve() if root is not None else self.script.parent
        self.built: dict[int, tuple[Any, tuple[Frame, ...]]] = {}
        self.iterated: dict[int, tuple[Any, tuple[Frame, ...]]] = {}
        self._mine: dict[str, bool] = {}
        self._tap: Any = None
        self._init: Any = None
        self.sources: dict[str, SourceFile] = {}

    # --- recording -------------------------------------------------------------------------------------------------

    def is_users(self, path: str) -> bool:
        """A file of the user's: under the root folder, not in site-packages, not fastpipe's own."""
        mine = self._mine.get(path)
        if mine is None:
            resolved = str(Path(path).resolve()) if not path.startswith("<") else path
            parts = Path(resolved).parts
            mine = (
                resolved.startswith(str(self.root) + os.sep)
                and not resolved.startswith(_FASTPIPE + os.sep)
                and "site-packages" not in parts
                and "dist-packages" not in parts
            )
            self._mine[path] = mine
        return mine

    def frames(self, frame: FrameType | None) -> tuple[Frame, ...]:
        """The user's frames from ``frame`` outwards, innermost first."""
        out = []
        while frame is not None:
            path = frame.f_code.co_filename
            if self.is_users(path):
                span = _position(frame)
                if span is not None:
                    out.append(Frame(str(Path(path).resolve()), span, frame.f_code.co_name, frame.f_globals))
            frame = frame.f_back
        return tuple(out)

    def _note(self, table: dict[int, tuple[Any, tuple[Frame, ...]]], obj: Any, frame: FrameType | None) -> None:
        if id(obj) in table:
            return
        frames = self.frames(frame)
        if frames:
            table[id(obj)] = (obj, frames)  # the object kept alive while recording: its id stays its own

    def __enter__(self) -> "SiteRecorder":
        recorder = self
        original_init = DataLoader.__init__

        @functools.wraps(original_init)
        def init(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
            recorder._note(recorder.built, loader, sys._getframe(1))
            original_init(loader, *args, **kwargs)

        self._init = (original_init, init)
        DataLoader.__init__ = init  # type: ignore[method-assign]

        def select(loader: DataLoader) -> None:
            recorder._note(recorder.iterated, loader, sys._getframe(1))
            return None

        self._tap = open_tap(select)
        return self

    def __exit__(self, *exc: Any) -> None:
        close_tap(self._tap)
        original_init, init = self._init
        if DataLoader.__dict__.get("__init__") is init:
            DataLoader.__init__ = original_init  # type: ignore[method-assign]

    # --- locating --------------------------------------------------------------------------------------------------

    def source(self, path: "str | Path") -> SourceFile:
        key = str(Path(path).resolve())
        if key not in self.sources:
            self.sources[key] = SourceFile.read(key)
        return self.sources[key]

    def creation(self, obj: Any, names: tuple[str, ...]) -> tuple["CallSite | None", str]:
        """The call that made ``obj``: the innermost user frame's call, when its callee is named one of ``names``
        (the class and its bases: a factory function is not rewritten); else (None, why)."""
        entry = self.built.get(id(obj))
        if entry is None or entry[0] is not obj:
            return None, f"its {type(obj).__name__} was not made while fastpipe recorded (or not in a file under {self.root})"
        for frame in entry[1]:
            source = self.source(frame.path)
            call = source.call_at(frame.span)
            if call is None:
                continue
            if _is_super_init(call):  # a subclass's __init__ calling DataLoader's: its own caller made it
                continue
            name = callee_name(call)
            if name in names:
                return CallSite(source, call, f"made at {frame.where(self.root)}", frame.namespace), ""
            return None, (
                f"its {type(obj).__name__} is made inside {name or 'a call'}(...) at {frame.where(self.root)}, "
                "not by a call to its class there: fastpipe does not rewrite a factory"
            )
        return None, f"no call of the user's made its {type(obj).__name__}"

    def sites(self, loader: Any) -> "Sites":
        """Where ``loader`` (the script's training DataLoader, live) was built and where its loop copies a batch."""
        sites = Sites(self.root, recorder=self)
        names = tuple(c.__name__ for c in type(loader).__mro__)
        sites.loader, why = self.creation(loader, names)
        if sites.loader is None:
            sites.why["loader"] = why
        sites.copy, why = self._copy_site(loader)
        if sites.copy is None:
            sites.why["copy"] = why
        return sites

    def _copy_site(self, loader: Any) -> tuple["CopySite | None", str]:
        entry = self.iterated.get(id(loader))
        if entry is None:
            return None, "the loader was not iterated from a file of the user's while fastpipe recorded"
        tried, unpacked = [], None
        for frame in entry[1]:
            source = self.source(frame.path)
            loop = _loop_at(source, frame.span[0])
            if loop is None:
                continue
            copy = copy_in_loop(source, loop)
            if copy is not None:
                return copy, ""
            tried.append(f"{_relative(frame.path, self.root)}:{loop.lineno}")
            images = unpacked_images(loop)
            if unpacked is None and images is not None:
                unpacked = CopySite(source, loop, None, images)
        if unpacked is not None:  # no copy (a CPU script): the batch is used where it is, from the loop's header
            return unpacked, ""
        if tried:
            return None, (
                f"no `x = x.to(device)` or `x.cuda()` of the batch in the loop(s) at {', '.join(tried)}, and the loop does "
                "not unpack the batch into a name for the images (`for images, target in loader`)"
            )
        return None, "the loader is not iterated by a `for` loop in the user's files"


def _is_super_init(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "__init__"
        and isinstance(func.value, ast.Call)
        and callee_name(func.value) == "super"
    )


def _loop_at(source: SourceFile, lineno: int) -> ast.For | None:
    """The ``for`` statement whose header holds line ``lineno`` (a frame suspended at its ``iter``/``next``)."""
    for node in ast.walk(source.tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and node.lineno <= lineno <= (node.iter.end_lineno or node.lineno):
            return node  # type: ignore[return-value]
    return None


@dataclass
class CallSite:
    """A call in the user's source: the file, the node, and how it was found (for the report)."""

    source: SourceFile
    call: ast.Call
    how: str
    namespace: dict[str, Any] = field(default_factory=dict, repr=False)
    """The module globals the call ran with (empty when unknown)."""

    def where(self, root: Path) -> str:
        return f"{_relative(self.source.path, root)}:{self.call.lineno}"


@dataclass
class CopySite:
    """The loop's copy of a batch to the device: the ``for`` loop, the assignment, and the name the images are in.

    ``statement`` None: the loop makes no copy (a script that trains on the CPU); ``images`` is then the name the loop's
    header unpacks the images into, and what belongs after the copy goes first in the loop's body."""

    source: SourceFile
    loop: ast.For
    statement: ast.stmt | None
    images: str


def _is_copy(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("to", "cuda")
        and isinstance(node.func.value, (ast.Name, ast.Subscript, ast.Attribute))
    )


def unpacked_images(loop: ast.For) -> str | None:
    """The name a loop's header unpacks the batch's images into: ``for images, target in loader`` and
    ``for i, (images, target) in enumerate(loader)`` give ``images``; None for ``for batch in loader``."""
    target = loop.target
    iterated = loop.iter
    if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and iterated.func.id == "enumerate":
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 2):
            return None
        target = target.elts[1]
    if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) >= 2 and isinstance(target.elts[0], ast.Name):
        return target.elts[0].id
    return None


def copy_in_loop(source: SourceFile, loop: ast.For) -> CopySite | None:
    """The first assignment in ``loop``'s body that copies a tensor to the device, and the name holding the images.

    The images are the first name assigned a ``.to(...)``/``.cuda(...)``: ``image, target = image.to(device),
    target.to(device)`` gives ``image``; ``images = images.cuda(non_blocking=True)`` gives ``images``.
    """
    for node in own_nodes(ast.Module(body=loop.body, type_ignores=[])):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and _is_copy(value):
            return CopySite(source, loop, node, target.id)
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for name, item in zip(target.elts, value.elts):
                if isinstance(name, ast.Name) and _is_copy(item):
                    return CopySite(source, loop, node, name.id)
    return None


@dataclass
class Sites:
    """Where the script built what a fix changes; :attr:`why` says, per part, why it was not found.

    Attributes:
        root: the script's folder (the diff's paths are relative to it).
        loader: the training DataLoader's constructor call.
        copy: the loop's copy of the batch to the device.
        why: ``{"loader" | "copy" | "dataset": reason}`` for each part not found.
    """

    root: Path
    loader: CallSite | None = None
    copy: CopySite | None = None
    why: dict[str, str] = field(default_factory=dict)
    recorder: SiteRecorder | None = None

    def dataset(self, owner: Any) -> tuple[CallSite | None, str]:
        """The call that built ``owner`` (the dataset the fix replaces): the loader call's ``dataset`` argument followed
        to a call of ``owner``'s class (or a base's), or (None, why not)."""
        if self.loader is None:
            return None, f"the DataLoader call was not found ({self.why.get('loader', '')})"
        names = tuple(c.__name__ for c in type(owner).__mro__ if c not in (object, Dataset))
        followed, how = follow_argument(self.loader, "dataset", 0, names, self.recorder)
        if followed is not None:
            return followed, ""
        return None, f"following the DataLoader call's dataset argument at {self.loader.where(self.root)}: {how}"


def argument(call: ast.Call, name: str, position: int) -> ast.AST | None:
    """The call's argument ``name`` (a keyword), or its ``position``-th positional one."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if position < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return None


def _function(
    call: ast.Call, source: SourceFile, namespace: dict[str, Any], recorder: SiteRecorder | None
) -> tuple[SourceFile, ast.FunctionDef, dict[str, Any]] | None:
    """The user's function a call calls: a top-level def of the same file, or (through the module's globals) one
    defined in another file of the user's."""
    name = callee_name(call)
    local = source.top_level_def(name or "")
    if isinstance(local, ast.FunctionDef) and isinstance(call.func, ast.Name):
        return source, local, namespace
    parts = dotted(call.func)
    if parts is None or recorder is None or parts[0] not in namespace:
        return None
    target: Any = namespace[parts[0]]
    for part in parts[1:]:
        target = getattr(target, part, None)
    code = getattr(inspect.unwrap(target), "__code__", None) if callable(target) else None
    if code is None or not recorder.is_users(code.co_filename):
        return None
    other = recorder.source(code.co_filename)
    node = next(
        (n for n in ast.walk(other.tree) if isinstance(n, ast.FunctionDef) and n.name == code.co_name and n.lineno <= code.co_firstlineno),
        None,
    )
    if node is None:
        return None
    return other, node, getattr(target, "__globals__", {})


def follow_argument(
    site: CallSite, name: str, position: int, names: tuple[str, ...], recorder: SiteRecorder | None
) -> tuple[CallSite | None, str]:
    """From a call's argument to the constructor call (callee named one of ``names``) that made its value, following a
    name to its assignment in the same function (one that calls the class, when there are several), and a call to a
    function of the user's files into its ``return``."""
    value = argument(site.call, name, position)
    if value is None:
        return None, f"the call at line {site.call.lineno} has no `{name}` argument"
    source, scope, line, index = site.source, site.source.scope_of(site.call), site.call.lineno, None
    namespace = site.namespace
    for _ in range(FOLLOW_DEPTH):
        if isinstance(value, ast.Call):
            called = callee_name(value)
            if called in names and index is None:
                return CallSite(source, value, f"followed `{name}` from line {site.call.lineno}", namespace), ""
            function = _function(value, source, namespace, recorder)
            if function is not None:
                source, function_node, namespace = function
                values = returned(function_node, index)
                if len(values) != 1:
                    return None, f"{called}() returns it from {len(values)} places"
                value, scope, line, index = values[0], function_node, values[0].lineno + 1, None
                continue
            return (
                None,
                f"it comes from {called or 'a call'}(...) at line {value.lineno}, not a call to its class: fastpipe does not rewrite a factory",
            )
        if isinstance(value, ast.Name):
            bindings = bindings_of(scope, value.id, line)
            if not bindings:
                return None, f"`{value.id}` is not assigned before line {line} in its function"
            calling = [b for b in bindings if isinstance(b.value, ast.Call) and callee_name(b.value) in names and b.index is None]
            binding = calling[-1] if calling else bindings[-1]
            value, line, index = binding.value, binding.statement.lineno, binding.index
            continue
        return None, f"`{ast.unparse(value)}` is neither a name nor a call"
    return None, f"more than {FOLLOW_DEPTH} steps from the call"
