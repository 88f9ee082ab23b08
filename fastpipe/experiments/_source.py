"""The user's source files as the patch writer reads them: parsed once, nodes found by position or by name.

Why a module of its own: the creation sites (:mod:`fastpipe.experiments._sites`) give live positions (a file, the span
of the call an outer frame was executing), and the patch writer (:mod:`fastpipe.experiments._patch`) edits text by
character offsets; between the two sits the AST: the ``Call`` node at a frame's position, the assignment a name came
from, the statement a node belongs to. Only what that needs is here; nothing is ever written to a file.

Positions follow CPython's: lines from 1, columns in UTF-8 bytes (``ast`` and ``co_positions`` agree); :meth:`offset`
turns them into character offsets in the text.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

Span = tuple[int, int, int, int]
"""(lineno, col_offset, end_lineno, end_col_offset) of a node or an instruction, columns in UTF-8 bytes."""


@dataclass
class SourceFile:
    """One parsed file: its text, its tree, and each node's parent."""

    path: Path
    text: str
    tree: ast.Module
    parents: dict[int, ast.AST] = field(default_factory=dict)

    @classmethod
    def read(cls, path: "str | Path") -> "SourceFile":
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        out = cls(path, text, tree)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                out.parents[id(child)] = node
        return out

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def offset(self, lineno: int, col: int) -> int:
        """The character offset in :attr:`text` of (line, UTF-8 byte column)."""
        lines = self.lines
        before = sum(len(line) for line in lines[: lineno - 1])
        line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
        return before + len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        return self.text[self.start(node) : self.end(node)]

    def line_start(self, lineno: int) -> int:
        return self.offset(lineno, 0)

    def indent(self, node: ast.AST) -> str:
        line = self.lines[node.lineno - 1]  # type: ignore[attr-defined]
        return line[: len(line) - len(line.lstrip())]

    def call_at(self, span: Span) -> ast.Call | None:
        """The ``Call`` whose span is ``span`` (what an outer frame is executing); else the smallest call around it."""
        best: ast.Call | None = None
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            here = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
            if here == span:
                return node
            if _contains(here, span) and (best is None or _contains(_span(best), here)):
                best = node
        return best

    def function_at(self, lineno: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The innermost function whose body holds line ``lineno``."""
        best = None
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= lineno <= (node.end_lineno or 0):
                if best is None or node.lineno >= best.lineno:
                    best = node
        return best

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function (or the module) a node's code runs in."""
        parent = self.parent(node)
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            parent = self.parent(parent)
        return parent if parent is not None else self.tree

    def statement_of(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            parent = self.parent(node)
            if parent is None:
                break
            node = parent
        return node  # type: ignore[return-value]

    def top_level_def(self, name: str) -> ast.FunctionDef | ast.ClassDef | None:
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return node
        return None


def _span(node: ast.AST) -> Span:
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined,return-value]


def _contains(outer: Span, inner: Span) -> bool:
    return (outer[0], outer[1]) <= (inner[0], inner[1]) and (inner[2], inner[3]) <= (outer[2], outer[3])


def callee_name(call: ast.Call) -> str | None:
    """The last name of a call's callee: ``DataLoader`` for ``torch.utils.data.DataLoader(...)``."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def dotted(node: ast.AST) -> list[str] | None:
    """``["torch", "utils", "data", "DataLoader"]`` for a Name/Attribute chain; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function (or module) body, not descending into nested functions, classes or lambdas."""
    body = getattr(scope, "body", [])
    stack: list[ast.AST] = list(reversed(body)) if isinstance(body, list) else [body]
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.append(child)


def bound_names(target: ast.AST) -> list[str | None]:
    """The names an assignment target binds, in order (None where an element is not a plain name)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        out: list[str | None] = []
        for element in target.elts:
            out.append(element.id if isinstance(element, ast.Name) else None)
        return out
    return [None]


@dataclass
class Binding:
    """Where a name got its value: the assignment, the value expression, and the name's index in a tuple target."""

    statement: ast.stmt
    value: ast.AST
    index: int | None
    """The name's place in an unpacked tuple (``a, b = f()``: b is 1); None for a plain ``name = value``."""


def binding_of(scope: ast.AST, name: str, before_line: int) -> Binding | None:
    """The last assignment to ``name`` in ``scope`` (its own body) on a line before ``before_line``."""
    found = bindings_of(scope, name, before_line)
    return found[-1] if found else None


def bindings_of(scope: ast.AST, name: str, before_line: int) -> list[Binding]:
    """Every assignment to ``name`` in ``scope`` (its own body) on a line before ``before_line``, in source order."""
    found: list[Binding] = []
    for node in own_nodes(scope):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.lineno >= before_line or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            names = bound_names(target)
            if name not in names:
                continue
            index = names.index(name)
            value = node.value
            if isinstance(target, (ast.Tuple, ast.List)):
                if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(names):
                    found.append(Binding(node, value.elts[index], None))
                else:
                    found.append(Binding(node, value, index))
            else:
                found.append(Binding(node, value, None))
    return sorted(found, key=lambda b: b.statement.lineno)


def returned(function: ast.AST, index: int | None) -> list[ast.AST]:
    """What ``function`` returns (the ``index``-th element of a returned tuple), one expression per ``return``."""
    out = []
    for node in own_nodes(function):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            if index is not None:
                if not isinstance(value, (ast.Tuple, ast.List)) or index >= len(value.elts):
                    continue
                value = value.elts[index]
            out.append(value)
    return out


def calls_named(scope: ast.AST, name: str) -> list[ast.Call]:
    """Every call in ``scope`` (all of it, nested functions too) whose callee's last name is ``name``."""
    return [node for node in ast.walk(scope) if isinstance(node, ast.Call) and callee_name(node) == name]


def import_line_after(source: SourceFile) -> int:
    """The line after which an ``import`` may go: the last of the module's leading imports (after its docstring and
    ``from __future__``), 0 for the top of a file with none."""
    last = 0
    for index, node in enumerate(source.tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            last = node.end_lineno or last
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last = node.end_lineno or last
            continue
        break
    return last


def imports_module(source: SourceFile, module: str) -> bool:
    """Whether the file already has ``import <module>`` at its top level (plain, no alias)."""
    for node in source.tree.body:
        if isinstance(node, ast.Import) and any(alias.name == module and alias.asname is None for alias in node.names):
            return True
    return False
