"""A fix as a unified diff of the user's own files: :func:`write_patch`.

Why a diff and not a snippet: a fix written against ``loader``/``step`` objects the script does not have is applied by
hand, and by hand the script's ``collate_fn`` (its mixup/cutmix) was dropped. Here each edit comes from comparing the
candidate's live objects with the original's, and lands on the call that built the original object (the creation
sites of :mod:`fastpipe.experiments._sites`):

* **the loader**: a DataLoader replaced by fastpipe's ThreadLoader (the callee swapped, ``num_workers`` becoming
  ``threads``, every other argument kept; one the ThreadLoader cannot take refuses the patch, naming it), wrapped in
  ``fastpipe.loading.recycled(...)``, or a setting changed (``num_workers=``, ``prefetch_factor=``: the keyword's value
  replaced, or the keyword added);
* **the dataset**: torchvision's ``ImageFolder`` replaced by fastpipe's (same arguments, in the same places; a preset
  object's chain passed as ``<preset>.transforms``, since the decoder takes over the crop from the chain's leaves);
* **the transform chain**: the float conversion and ``Normalize`` removed from where the chain is assembled (a list
  element, or an ``append`` statement; ``ToTensor`` becomes ``PILToTensor``);
* **Normalize on the device**: ``device_normalize = fastpipe.Normalize(mean=..., std=...)`` before the loop and
  ``images = device_normalize(images)`` after its copy to the device.

An edit that cannot be placed is listed in :attr:`Patch.unplaced` with its reason, and :attr:`Patch.snippet` gives
the change in the script's own names where they are known. ``import fastpipe...`` lines are added where new code
needs them. Nothing is written into the user's files: the diff is text, its paths relative to the script's folder,
so ``patch -p0`` run there applies it.
"""

from __future__ import annotations

import ast
import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from torch.utils.data import DataLoader

from fastpipe.experiments._fix_candidates import Candidate, PipelineView, view_of
from fastpipe.experiments._sites import CallSite, SiteRecorder, Sites, argument
from fastpipe.experiments._source import SourceFile, binding_of, callee_name, calls_named, import_line_after, imports_module, own_nodes
from fastpipe.workloads._workload import Workload

THREAD_LOADER = "fastpipe.datasets.ThreadLoader"
IMAGE_FOLDER = "fastpipe.datasets.ImageFolder"
NORMALIZE = "fastpipe.Normalize"
RECYCLED = "fastpipe.loading.recycled"
LOADER_SETTINGS = ("num_workers", "prefetch_factor", "batch_size", "pin_memory", "drop_last", "persistent_workers")
"""The DataLoader settings a fix may change in place (the keyword's value edited, or the keyword added)."""
NORMALIZE_NOWHERE = (
    "the fix takes Normalize out of the transform, and with no place found to put it back the patched script would "
    "train on unnormalized uint8 images"
)
"""Why a fix's placed edits are withheld when its Normalize after the copy could not be placed."""
NO_MEANING_FOR_THREADS = ("prefetch_factor", "persistent_workers", "timeout", "multiprocessing_context", "pin_memory_device", "in_order")
"""DataLoader arguments about worker processes: a ThreadLoader has none, so they are dropped with a note."""


@dataclass
class Patch:
    """One fix as edits of the user's files.

    Attributes:
        fix: the candidate's name.
        diff: a unified diff of the script's files (paths relative to the script's folder: ``patch -p0`` there
            applies it); None when no edit could be placed, or the fix was refused.
        unplaced: each edit that could not be placed, and why.
        snippet: the unplaced changes in the script's own names where fastpipe knows them (else the fix's code).
        changes: what each placed edit does, in words, with its file and line.
        notes: what the user should know about the patched script (an argument dropped as meaningless, a value
            replaced by a literal).
        refused: why the fix cannot be written without losing something the loader did (then ``diff`` is None).
        withheld: why the placed edits are not handed out as a diff: without an edit that could not be placed they
            would break the script (then ``diff`` is None).
    """

    fix: str
    diff: str | None = None
    unplaced: list[str] = field(default_factory=list)
    snippet: str = ""
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refused: str | None = None
    withheld: str | None = None

    def text(self) -> str:
        """The patch for a report: what it changes, what it could not place, and the diff."""
        lines = [f"Patch for: {self.fix}"]
        if self.refused:
            lines.append(f"  refused: {self.refused}")
        lines += [f"  - {change}" for change in self.changes]
        lines += [f"  note: {note}" for note in self.notes]
        if self.unplaced:
            lines.append("  not placed (apply by hand):")
            lines += [f"    * {why}" for why in self.unplaced]
        if self.snippet:
            lines.append("  in your script's names:")
            lines += [f"    {line}" for line in self.snippet.splitlines()]
        if self.diff:
            partial = " (partial: the edits above that were not placed are missing)" if self.unplaced else ""
            lines.append(f"  diff{partial}; apply from the script's folder with `patch -p0 < FILE`:")
            lines.append(self.diff.rstrip("\n"))
        elif self.withheld:
            lines.append(f"  no diff: {self.withheld}")
        elif not self.refused:
            lines.append("  no diff: nothing could be placed")
        return "\n".join(lines) + "\n"


class _Unplaceable(Exception):
    """An edit that cannot be made in the text as it stands (the reason is the message)."""


@dataclass
class _Edit:
    path: Path
    start: int
    end: int
    text: str


class _Writer:
    """The edits of one patch, per file, with the imports they need."""

    def __init__(self, patch: Patch, sites: Sites) -> None:
        self.patch, self.sites = patch, sites
        self.edits: list[_Edit] = []
        self.imports: dict[Path, set[str]] = {}
        self.snippets: list[str] = []
        self.withhold: str | None = None
        """Why no diff may be handed out though edits were placed: one left out would break the script."""

    def replace(self, source: SourceFile, start: int, end: int, text: str, module: str | None = None) -> None:
        self.edits.append(_Edit(source.path, start, end, text))
        if module is not None:
            self.imports.setdefault(source.path, set()).add(module)

    def remove(self, source: SourceFile, node: ast.AST, siblings: Sequence[ast.AST]) -> None:
        """Remove ``node``, one of the comma-separated ``siblings`` (list elements, a call's arguments), with its comma;
        whole lines when it sits on lines of its own."""
        start, end = source.start(node), source.end(node)
        text = source.text
        line_start = text.rfind("\n", 0, start) + 1
        after = end
        while after < len(text) and text[after] in " \t":
            after += 1
        if after < len(text) and text[after] == ",":
            after += 1
        line_end = text.find("\n", after)
        line_end = len(text) if line_end < 0 else line_end + 1
        own_lines = not text[line_start:start].strip() and not text[after:line_end].split("#")[0].strip()
        if isinstance(node, ast.stmt):
            if not own_lines:
                raise _Unplaceable(f"line {node.lineno} holds more than the statement to remove")
            body = [n for n in siblings if isinstance(n, ast.stmt)]
            alone = len(body) == 1  # a block's only statement: `pass` keeps the block
            self.replace(source, line_start, line_end, f"{source.indent(node)}pass\n" if alone else "")
            return
        if own_lines:
            self.replace(source, line_start, line_end, "")
            return
        index = [id(s) for s in siblings].index(id(node))
        if index + 1 < len(siblings):
            self.replace(source, start, source.start(siblings[index + 1]), "")
        elif index > 0:
            self.replace(source, source.end(siblings[index - 1]), end, "")
        else:
            self.replace(source, start, after, "")

    def unplaced(self, why: str, snippet: str = "") -> None:
        self.patch.unplaced.append(why)
        if snippet and snippet not in self.snippets:
            self.snippets.append(snippet)

    def finish(self) -> None:
        root = self.sites.root
        by_file: dict[Path, list[_Edit]] = {}
        for edit in self.edits:
            by_file.setdefault(edit.path, []).append(edit)
        for path, modules in self.imports.items():
            source = self._source(path)
            line = import_line_after(source)
            wanted = {m for m in modules if m == "torchvision" or not any(o.startswith(m + ".") for o in modules)}
            needed = sorted(m for m in wanted if not imports_module(source, m))
            if needed:
                at = source.line_start(line + 1) if line < len(source.lines) else len(source.text)
                by_file.setdefault(path, []).append(_Edit(path, at, at, "".join(f"import {m}\n" for m in needed)))
        chunks = []
        for path in sorted(by_file):
            source = self._source(path)
            new = _apply(source.text, by_file[path])
            name = _relative(path, root)
            try:
                ast.parse(new)
            except SyntaxError as exc:  # a safety net: a patch that does not parse is never handed out
                self.patch.unplaced.append(f"{name}: the edits would not parse ({exc.msg}, line {exc.lineno}); none of them is in the diff")
                continue
            chunks.append("".join(difflib.unified_diff(source.text.splitlines(True), new.splitlines(True), fromfile=name, tofile=name)))
        self.patch.diff = "".join(chunks) or None
        self.patch.snippet = "\n".join(self.snippets)

    def _source(self, path: Path) -> SourceFile:
        recorder = self.sites.recorder
        return recorder.source(path) if recorder is not None else SourceFile.read(path)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def _apply(text: str, edits: list[_Edit]) -> str:
    """``text`` with ``edits`` made; overlapping deletions merged (two neighbours removed from one list)."""
    ordered = sorted(edits, key=lambda e: (e.start, e.end))
    merged: list[_Edit] = []
    for edit in ordered:
        last = merged[-1] if merged else None
        if last is not None and edit.start < last.end and not edit.text and not last.text:
            last.end = max(last.end, edit.end)
            continue
        if last is not None and edit.start < last.end:
            raise ValueError(f"overlapping edits at {edit.start} in {edit.path}")
        merged.append(_Edit(edit.path, edit.start, edit.end, edit.text))
    for edit in reversed(merged):
        text = text[: edit.start] + edit.text + text[edit.end :]
    return text


# --- what changed -----------------------------------------------------------------------------------------------


def _unwrap_recycled(loader: Any) -> tuple[Any, bool]:
    from fastpipe.loading import RecycledLoader

    if isinstance(loader, RecycledLoader):
        return loader.source, True
    return loader, False


def _statement_target(source: SourceFile, call: ast.Call) -> str | None:
    statement = source.statement_of(call)
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        if statement.value is call:
            return statement.targets[0].id
    return None


def _named(value: Any) -> str:
    """A live value for a message: a function by its qualified name, anything else by its repr."""
    name = getattr(value, "__qualname__", None)
    return f"{getattr(value, '__module__', '')}.{name}".lstrip(".") if callable(value) and name else repr(value)


def _literal(value: Any) -> str:
    return repr(value)


def _bind(call: ast.Call, function: Any, skip_self: bool) -> dict[str, ast.AST] | None:
    """The call's argument nodes by parameter name, bound as Python would bind them to ``function``; None when the
    call spreads ``*args``/``**kwargs`` or does not fit."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if skip_self and parameters and parameters[0].name == "self":
        signature = signature.replace(parameters=parameters[1:])
    try:
        bound = signature.bind(*call.args, **{k.arg: k.value for k in call.keywords if k.arg})
    except TypeError:
        return None
    return dict(bound.arguments)


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _arguments(call: ast.Call) -> list[ast.AST]:
    """The call's arguments in source order (positional nodes, then keyword nodes as they stand)."""
    return sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))


def _append_argument(writer: _Writer, source: SourceFile, call: ast.Call, text: str) -> None:
    """Add ``text`` (``name=value``) as the call's last argument, in its layout (one a line when it has them so)."""
    items = _arguments(call)
    if not items:
        at = source.end(call) - 1
        writer.replace(source, at, at, text)
        return
    last = items[-1]
    end = source.end(last)
    rest = source.text[end : source.end(call)]
    multiline = last.lineno != call.lineno  # type: ignore[attr-defined]
    if multiline:
        indent = source.indent(last)
        comma = rest.lstrip().startswith(",")
        at = end + (rest.index(",") + 1 if comma else 0)
        writer.replace(source, at, at, ("" if comma else ",") + f"\n{indent}{text}" + ("," if comma else ""))
    else:
        writer.replace(source, end, end, f", {text}")


def _loader_edits(writer: _Writer, original: Workload, new_loader: Any) -> None:
    from fastpipe.datasets import ThreadLoader

    old = original.loader
    inner, wrapped = _unwrap_recycled(new_loader)
    site = writer.sites.loader
    changed = (
        isinstance(inner, ThreadLoader)
        or wrapped
        or any(getattr(inner, name, None) != getattr(old, name, None) for name in LOADER_SETTINGS if isinstance(inner, DataLoader))
    )
    if not changed:
        return
    if site is None:
        writer.unplaced(f"the DataLoader call: {writer.sites.why.get('loader', 'not found')}")
        return
    source, call = site.source, site.call
    name = _statement_target(source, call) or "loader"
    where = site.where(writer.sites.root)
    if isinstance(inner, ThreadLoader):
        _to_thread_loader(writer, site, old, inner)
        if writer.patch.refused:
            return
    elif isinstance(inner, DataLoader):
        bound = _bind(call, DataLoader.__init__, skip_self=True) or {}
        for setting in LOADER_SETTINGS:
            before, after = getattr(old, setting, None), getattr(inner, setting, None)
            if before == after:
                continue
            node = bound.get(setting)  # passed by keyword or by position: its value is replaced in place
            if node is not None:
                writer.replace(source, source.start(node), source.end(node), _literal(after))
                writer.patch.changes.append(
                    f"{where}: {setting}={ast.unparse(node)} -> {setting}={after!r} (the value measured; it was {before!r})"
                )
            else:
                _append_argument(writer, source, call, f"{setting}={after!r}")
                writer.patch.changes.append(f"{where}: {setting}={after!r} added (it was {before!r})")
    if wrapped:
        start, end = source.start(call), source.end(call)
        writer.replace(source, start, start, f"{RECYCLED}(", "fastpipe.loading")
        writer.replace(source, end, end, ")")
        writer.patch.changes.append(f"{where}: {name} = {RECYCLED}(DataLoader(...)): workers collate into reused buffers")


def _to_thread_loader(writer: _Writer, site: CallSite, old: DataLoader, new: Any) -> None:
    """DataLoader(...) -> ThreadLoader(...): the callee swapped, num_workers -> threads, every other argument kept or
    the patch refused."""
    source, call = site.source, site.call
    bound = _bind(call, DataLoader.__init__, skip_self=True)
    if bound is None:
        writer.patch.refused = (
            f"the DataLoader call at {site.where(writer.sites.root)} spreads *args/**kwargs: its arguments cannot be read"
        )
        return
    accepted = set(inspect.signature(type(new).__init__).parameters)
    dropped, lost = [], []
    for parameter, node in bound.items():
        if parameter in accepted or parameter == "num_workers":
            continue
        if isinstance(node, ast.Constant) and node.value is None:
            dropped.append(node)
        elif parameter in NO_MEANING_FOR_THREADS:
            dropped.append(node)
            writer.patch.notes.append(
                f"{parameter}={ast.unparse(node)} dropped: it sets up worker processes, which a ThreadLoader does not start"
            )
        else:
            lost.append(f"{parameter}={ast.unparse(node)}")
    if lost:
        live = ", ".join(f"{p.split('=')[0]}={_named(getattr(old, p.split('=')[0], None))}" for p in lost)
        writer.patch.refused = (
            f"fastpipe's ThreadLoader cannot keep {', '.join(lost)} of the DataLoader call at {site.where(writer.sites.root)} "
            f"(in this run: {live}; with other arguments the script may set it, e.g. mixup/cutmix in a collate_fn): "
            "the fix would change what the model trains on, so no patch is written for it"
        )
        return
    keywords = {id(k.value): k for k in call.keywords}
    items = _arguments(call)
    for node in dropped:
        item = keywords.get(id(node), node)
        writer.remove(source, item, items)
    writer.replace(source, source.start(call.func), source.end(call.func), THREAD_LOADER, "fastpipe.datasets")
    where = site.where(writer.sites.root)
    threads = getattr(new, "threads", 1)
    workers = bound.get("num_workers")
    value = ast.unparse(workers) if workers is not None and threads == old.num_workers else repr(threads)
    if workers is not None:
        keyword = keywords.get(id(workers))
        node = keyword if keyword is not None else workers
        writer.replace(source, source.start(node), source.end(node), f"threads={value}")
    else:
        _append_argument(writer, source, call, f"threads={value}")
    kept = [p for p in bound if p in accepted and p != "self"]
    writer.patch.changes.append(
        f"{where}: DataLoader -> {THREAD_LOADER} with threads={value} (was num_workers={old.num_workers}); kept: {', '.join(kept)}"
    )


def _dataset_edits(writer: _Writer, old_view: PipelineView, new_view: PipelineView) -> None:
    import torchvision

    from fastpipe.datasets import ImageFolder

    if type(old_view.owner) is type(new_view.owner):
        return
    site, why = writer.sites.dataset(old_view.owner)
    snippet = f"dataset = {IMAGE_FOLDER}({getattr(new_view.owner, 'root', '...')!r}, transform=<the same transform>)"
    if site is None:
        writer.unplaced(f"the dataset's {type(old_view.owner).__name__}(...) call: {why}", snippet)
        return
    source, call = site.source, site.call
    where = site.where(writer.sites.root)
    if not isinstance(new_view.owner, ImageFolder) or type(old_view.owner) is not torchvision.datasets.ImageFolder:
        writer.unplaced(
            f"{where}: fastpipe rewrites torchvision's ImageFolder(...) in place; this is {type(old_view.owner).__name__}",
            snippet,
        )
        return
    bound = _bind(call, type(old_view.owner).__init__, skip_self=True)
    if bound is None:
        writer.unplaced(f"{where}: the call's arguments cannot be read (*args/**kwargs)", snippet)
        return
    writer.replace(source, source.start(call.func), source.end(call.func), IMAGE_FOLDER, "fastpipe.datasets")
    attr = old_view.via.split(".", 1)[1] if old_view.via else None
    transform = bound.get("transform")
    if attr is not None and transform is not None:
        end = source.end(transform)
        writer.replace(source, end, end, f".{attr}")
    kept = ", ".join(bound)
    opened = f"; the transform passed as its chain (.{attr}), whose leading crop the decoder takes over" if attr else ""
    writer.patch.changes.append(f"{where}: torchvision.datasets.ImageFolder -> {IMAGE_FOLDER}, arguments kept ({kept}){opened}")


def _class_file(cls: type) -> str | None:
    """The file a class is defined in, from its methods' code (``inspect.getfile`` asks ``sys.modules``, which may no
    longer hold a script's own module)."""
    for value in vars(cls).values():
        code = getattr(value, "__code__", None)
        if code is not None:
            return code.co_filename
    return None


def _transform_scope(writer: _Writer, view: PipelineView) -> tuple[SourceFile | None, ast.AST | None, str]:
    """Where the transform's leaves are built: a preset class of the user's (its class body), or the Compose call
    the dataset's ``transform`` argument names."""
    transform = view.transform
    recorder = writer.sites.recorder
    cls = type(transform)
    path = _class_file(cls)
    if path is not None and recorder is not None and recorder.is_users(path):
        source = recorder.source(path)
        node = source.top_level_def(cls.__name__)
        if node is not None:
            return source, node, f"{_relative(source.path, writer.sites.root)}:{node.lineno} ({cls.__name__})"
    site, why = writer.sites.dataset(view.owner)
    if site is None:
        return None, None, why
    node = argument(site.call, "transform", 1)
    source = site.source
    for _ in range(4):
        if isinstance(node, ast.Name):
            binding = binding_of(source.scope_of(site.call), node.id, site.call.lineno)
            node = binding.value if binding is not None and binding.index is None else None
            continue
        break
    if isinstance(node, ast.Call):
        return source, node, f"{_relative(source.path, writer.sites.root)}:{node.lineno}"
    return None, None, "the dataset call's transform argument is not a call or a name assigned one"


def _names_bound_to(source: SourceFile, scope: ast.AST, leaf_name: str) -> list[ast.AST]:
    """The list elements of ``scope`` that are a name assigned a call of ``leaf_name`` earlier in the function
    (pytorch/examples: ``normalize = transforms.Normalize(...)``, then ``Compose([..., normalize])``)."""
    out: list[ast.AST] = []
    function = source.scope_of(scope)
    for node in ast.walk(scope):
        if isinstance(node, (ast.List, ast.Tuple)):
            for element in node.elts:
                if isinstance(element, ast.Name):
                    binding = binding_of(function, element.id, element.lineno)
                    if binding is not None and isinstance(binding.value, ast.Call) and callee_name(binding.value) == leaf_name:
                        out.append(element)
    return out


def _removable(source: SourceFile, call: ast.AST) -> tuple[ast.AST, Sequence[ast.AST]] | None:
    """What removing this leaf's call removes: the list element it is (a conditional expression around it
    included), or an ``x.append(call)`` statement; None when it is neither."""
    node: ast.AST = call
    parent = source.parent(node)
    if isinstance(parent, ast.IfExp):
        node, parent = parent, source.parent(parent)
    if isinstance(parent, (ast.List, ast.Tuple)):
        return node, parent.elts
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr == "append":
        statement = source.parent(parent)
        if isinstance(statement, ast.Expr):
            container = source.parent(statement)
            body = getattr(container, "body", [])
            return statement, body
    return None


def _chain_edits(writer: _Writer, old_view: PipelineView, new_view: PipelineView) -> None:
    kept = {id(leaf) for leaf in new_view.leaves}
    before = {id(leaf) for leaf in old_view.leaves}
    removed = [leaf for leaf in old_view.leaves if id(leaf) not in kept]
    added = [leaf for leaf in new_view.leaves if id(leaf) not in before]
    if not removed and not added:
        return
    names = ", ".join(type(leaf).__name__ for leaf in removed)
    snippet = f"remove {names} from the transform" + (f"; end it with {type(added[0]).__name__}()" if added else "")
    source, scope, where = _transform_scope(writer, old_view)
    if source is None or scope is None:
        writer.unplaced(f"the transform chain: {where}", snippet)
        return
    replace_with = type(added[0]).__name__ if len(added) == 1 and type(added[0]).__name__ == "PILToTensor" else None
    if added and replace_with is None:
        writer.unplaced(f"the transform chain at {where}: fastpipe adds only PILToTensor in place of ToTensor", snippet)
        return
    for leaf in removed:
        leaf_name = type(leaf).__name__
        calls: list[ast.AST] = list(calls_named(scope, leaf_name)) or _names_bound_to(source, scope, leaf_name)
        if len(calls) != 1:
            writer.unplaced(f"{leaf_name} in the transform at {where}: {len(calls)} calls of it there, not one", snippet)
            continue
        call = calls[0]
        line = f"{_relative(source.path, writer.sites.root)}:{call.lineno}"
        if replace_with is not None and leaf_name == "ToTensor" and isinstance(call, ast.Call):
            func = call.func
            if isinstance(func, ast.Attribute):
                start = source.end(func) - len(func.attr)
                writer.replace(source, start, source.end(func), replace_with)
            else:
                writer.replace(source, source.start(call), source.end(call), "torchvision.transforms.PILToTensor()", "torchvision")
            writer.patch.changes.append(f"{line}: ToTensor() -> {replace_with}() (the images stay uint8 until the device)")
            continue
        target = _removable(source, call)  # type: ignore[arg-type]
        if target is None:
            writer.unplaced(f"{leaf_name} at {line}: not a list element or an append(...) of the chain", snippet)
            continue
        try:
            writer.remove(source, *target)
        except _Unplaceable as exc:
            writer.unplaced(f"{leaf_name} at {line}: {exc}", snippet)
            continue
        writer.patch.changes.append(f"{line}: {leaf_name} removed from the transform")


def _device_normalize(transform: Any) -> Any:
    from fastpipe.transforms.device import Normalize

    steps = getattr(transform, "steps", (transform,))
    return next((step for step in steps if isinstance(step, Normalize)), None)


def _normalize_edits(writer: _Writer, original: Workload, new: Workload) -> None:
    normalize = _device_normalize(new.device_transform)
    if normalize is None or _device_normalize(original.device_transform) is not None:
        return
    mean, std = (tuple(round(v, 6) for v in values) for values in (normalize.mean, normalize.std))
    make = f"{NORMALIZE}(mean={mean}, std={std})"
    copy = writer.sites.copy
    if copy is None:
        writer.unplaced(
            f"the copy to the device: {writer.sites.why.get('copy', 'not found')}",
            f"after the copy to the device: images = {make}(images)",
        )
        writer.withhold = NORMALIZE_NOWHERE
        return
    source, loop = copy.source, copy.loop
    used = {n.id for n in own_nodes(source.scope_of(loop)) if isinstance(n, ast.Name)}
    name = next(n for n in ("device_normalize", "fastpipe_normalize", "fastpipe_device_normalize") if n not in used)
    at = source.line_start(loop.lineno)
    writer.replace(source, at, at, f"{source.indent(loop)}{name} = {make}  # fastpipe: Normalize on the device\n", "fastpipe")
    where = _relative(source.path, writer.sites.root)
    if copy.statement is None:  # no copy in the loop (it trains on the CPU): first thing in its body, as fastpipe measured it
        first = loop.body[0]
        if first.lineno == loop.lineno:  # `for x, y in loader: step(x)` on one line: no line of its own to insert
            writer.unplaced(f"the loop at line {loop.lineno} holds its body on its own line", f"images = {make}(images)")
            writer.withhold = NORMALIZE_NOWHERE
            return
        at = source.line_start(first.lineno)
        writer.replace(source, at, at, f"{source.indent(first)}{copy.images} = {name}({copy.images})\n")
        writer.patch.changes.append(
            f"{where}:{first.lineno}: {copy.images} = {name}({copy.images}) first in the loop's body: the loop copies no "
            f"batch to a device, so the batch is normalized where it is ({name} made before the loop at line {loop.lineno})"
        )
        return
    # after the loop-body statement that holds the copy: a copy under `if args.gpu is not None:` still gets its
    # images normalized when the branch is not taken (they are then normalized where they are)
    statement: ast.AST = copy.statement
    while source.parent(statement) is not loop:
        statement = source.parent(statement)  # type: ignore[assignment]
    end = statement.end_lineno or statement.lineno  # type: ignore[attr-defined]
    after = source.line_start(end + 1) if end < len(source.lines) else len(source.text)
    writer.replace(source, after, after, f"{source.indent(statement)}{copy.images} = {name}({copy.images})\n")
    writer.patch.changes.append(
        f"{where}:{copy.statement.lineno}: {copy.images} = {name}({copy.images}) after the copy to the device "
        f"({name} made before the loop at line {loop.lineno})"
    )


def _collate_note(writer: _Writer, original: Workload, old_view: PipelineView | None, new_view: PipelineView | None) -> None:
    """A collate_fn that sees the images the transform now ends with (uint8, not floats)."""
    from torch.utils.data import default_collate

    if old_view is None or new_view is None or writer.sites.loader is None:
        return
    if [id(x) for x in old_view.leaves] == [id(x) for x in new_view.leaves]:
        return
    keyword = _keyword(writer.sites.loader.call, "collate_fn")
    live = getattr(original.loader, "collate_fn", None)
    if keyword is None or (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
        return
    expr = ast.unparse(keyword.value)
    if live is not None and live is not default_collate:
        writer.patch.refused = (
            f"the loader's collate_fn ({expr}) would receive uint8 images where it received floats: mixup/cutmix on "
            "uint8 is another augmentation (or an error); keep Normalize where it is for this script"
        )
    else:
        writer.patch.notes.append(
            f"the DataLoader passes collate_fn={expr} (torch's default_collate in this run): set to a function (mixup, "
            "cutmix), it would receive uint8 images where it received floats"
        )


def write_patch(script: "str | Path", original: Workload, candidate: Candidate, sites: Sites) -> Patch:
    """The fix ``candidate`` as a unified diff of ``script``'s own files.

    Args:
        script: the training script's path (the diff's paths are relative to its folder).
        original: the script's workload as fastpipe found it: its ``loader`` is the script's live training
            DataLoader (the object the script built), ``device_transform`` what runs after the copy (None in a plain
            script).
        candidate: the fix (:class:`~fastpipe.experiments._fix_candidates.Candidate`), with its ``workload``: the
            same workload with one thing changed (the loader, its dataset, the transform's leaves, a Normalize on the
            device). Its live objects are compared with the original's; the leaves are compared by identity, as the
            candidates reuse the user's transform objects.
        sites: where the script built them, from :meth:`fastpipe.experiments._sites.SiteRecorder.sites` on the
            original loader (a recorder open while the script ran).

    Returns:
        A :class:`Patch`: the diff (None when nothing could be placed, or the fix would drop something the loader did:
        ``refused`` says what), what could not be placed and why, and a snippet in the script's own names.
    """
    del script  # the folder is the sites' root: the recorder was opened on the script
    patch = Patch(candidate.name)
    if candidate.workload is None:
        patch.unplaced.append(f"the fix is not measured ({candidate.not_tried or 'advice only'}): no patch is written")
        patch.snippet = candidate.code
        return patch
    writer = _Writer(patch, sites)
    new = candidate.workload
    old_view, _ = view_of(original)
    new_view, _ = view_of(new)
    _collate_note(writer, original, old_view, new_view)
    if patch.refused:
        return patch
    _loader_edits(writer, original, new.loader)
    if patch.refused:
        return patch
    if old_view is not None and new_view is not None:
        _dataset_edits(writer, old_view, new_view)
        _chain_edits(writer, old_view, new_view)
    _normalize_edits(writer, original, new)
    writer.finish()
    if writer.withhold is not None and patch.diff is not None:
        patch.diff, patch.withheld = None, writer.withhold
    if patch.unplaced and not patch.snippet:
        patch.snippet = candidate.code
    if patch.diff is None and not patch.unplaced:
        patch.unplaced.append("the fix changes nothing fastpipe can see in the script's objects")
    return patch


def patch_for_report(script: "str | Path", report: Any, recorder: SiteRecorder) -> Patch | None:
    """The patch of the fix a ``fix`` report recommends first: its ``best`` result (the combined set where it won),
    else its first recommended one; None when nothing is recommended or the result carries no live candidate.

    For ``fastpipe fix -- python train.py --patch out.diff``: ``recorder`` was open on the script while it ran; the
    candidate carries the workload it was built from (``candidate.original``), whose loader is the script's own, and
    the recorder's sites of that loader say where to edit.
    """
    recommended = list(report.recommended)
    chosen = next((r for r in recommended if r.name == report.best), recommended[0] if recommended else None)
    candidate = getattr(chosen, "candidate", None)
    if candidate is None or candidate.original is None:
        return None
    return write_patch(script, candidate.original, candidate, recorder.sites(candidate.original.loader))


__all__ = ["Patch", "patch_for_report", "write_patch"]
