"""Where a script's loop gets its batches when it iterates no DataLoader: a generator, a ``get_batch()`` function.

``fastpipe watch`` and script mode tap ``DataLoader.__iter__``; a loop over a generator, or nanoGPT's
``X, Y = get_batch('train')``, passes no tap. What they can still see without touching the script is where its
main thread is: :class:`LoopSampler` reads that thread's stack every ``period_s`` (``sys._current_frames``, from a
thread of its own; nothing in the script is patched or wrapped) and keeps, for each call from one of the script's
own functions into another (the callee on the stack, the caller at a line), how many samples it was running in.

A call's share is its samples over the samples in the loop around its call site (the innermost ``for`` or
``while`` of the caller's source containing the line, read with :mod:`ast`): the share of the loop's time the
loop spent in it. With no workers behind it, the time in a generator the loop iterates, or in the function it
calls for its batches, is time the loop waits for data. A share is an estimate from a count: its error is the
binomial one, stated with it. Code under ``site-packages`` is never the script's.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType

PERIOD_S = 0.005
"""How often the main thread's stack is read (a read costs tens of microseconds)."""


@dataclass(frozen=True)
class LoopCall:
    """One of the script's functions, called from its loop, and the share of the loop's time spent inside it."""

    name: str
    where: str
    """``file:line`` of its ``def``."""
    call_site: str
    """``file:line`` of the call (for a generator, the line that asks for its next item)."""
    loop: str
    """``file:first-last`` of the loop around the call."""
    generator: bool
    samples: int
    loop_samples: int
    feeds: bool = False
    """What it returns (or yields) the loop hands to another call of its own: it makes the loop's batches."""

    @property
    def share(self) -> float:
        return self.samples / self.loop_samples if self.loop_samples else 0.0

    @property
    def error(self) -> float:
        """The share's standard error, from the count (binomial)."""
        n = self.loop_samples
        return (self.share * (1 - self.share) / n) ** 0.5 if n else 0.0

    def words(self) -> str:
        kind = "the generator it iterates" if self.generator else "the function it calls"
        kind += ", whose results the loop passes on: its batches" if self.feeds else ""
        return (
            f"{self.name} ({kind}; defined at {self.where}, {'asked for items' if self.generator else 'called'} at "
            f"{self.call_site}): {self.share:.0%} ±{self.error:.0%} of the loop's time ({self.samples} of {self.loop_samples} samples)"
        )


class LoopSampler:
    """Samples the calling thread's stack from a thread of its own, keeping the calls between the script's functions."""

    def __init__(self, script: str, *, period_s: float = PERIOD_S) -> None:
        self.folder = str(Path(script).resolve().parent)
        self.period_s = period_s
        self.thread_id = threading.get_ident()
        self.calls: Counter[tuple[CodeType, int, CodeType]] = Counter()
        self.lines: dict[CodeType, Counter[int]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastpipe-loop-sampler", daemon=True)
        self._ours: dict[str, bool] = {}

    def __enter__(self) -> "LoopSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(1.0)

    def _is_script(self, filename: str) -> bool:
        ours = self._ours.get(filename)
        if ours is None:
            full = os.path.abspath(filename)  # runpy compiles the script under the path it was given, maybe relative
            ours = full.startswith(self.folder + os.sep) and "site-packages" not in full
            self._ours[filename] = ours
        return ours

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            frame = sys._current_frames().get(self.thread_id)
            if frame is not None:
                self._sample(frame)
            del frame

    def _sample(self, frame: FrameType | None) -> None:
        mine: list[FrameType] = []
        while frame is not None:
            if self._is_script(frame.f_code.co_filename):
                mine.append(frame)
            frame = frame.f_back
        if not mine:
            return
        self.samples += 1
        for callee, caller in zip(mine, mine[1:]):
            if callee.f_back is caller:  # a direct call (a generator's f_back is the frame that resumed it)
                self.calls[(caller.f_code, caller.f_lineno, callee.f_code)] += 1
        for f in mine:
            self.lines.setdefault(f.f_code, Counter())[f.f_lineno] += 1

    def loop_calls(self, limit: int = 5) -> list[LoopCall]:
        """The script's functions its loops spent the most time in: the ones that make the loop's batches first, then by
        time (calls outside any loop, and calls inside another listed function, left out)."""
        found: dict[tuple[CodeType, CodeType], LoopCall] = {}
        for (caller, line, callee), count in self.calls.items():
            span = _loop_around(caller, line)
            if span is None:
                continue
            loop_samples = sum(n for at, n in self.lines.get(caller, Counter()).items() if span[0] <= at <= span[1])
            key = (caller, callee)
            before = found.get(key)
            call = LoopCall(
                name=callee.co_name,
                where=f"{_short(callee.co_filename)}:{callee.co_firstlineno}",
                call_site=f"{_short(caller.co_filename)}:{line}",
                loop=f"{_short(caller.co_filename)}:{span[0]}-{span[1]}",
                generator=bool(callee.co_flags & (inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR)),
                samples=count + (before.samples if before is not None else 0),
                loop_samples=loop_samples,
                feeds=(before is not None and before.feeds) or _feeds(caller.co_filename, line, span, callee.co_name),
            )
            found[key] = call
        # a call inside one of the listed callees (get_batch inside the generator the loop iterates) is part of that one
        callees = {callee for _, callee in found}
        outer = [call for (caller, _), call in found.items() if caller not in callees]
        return sorted(outer, key=lambda c: (not c.feeds, -c.samples))[:limit]


def no_loader_text(calls: list[LoopCall], period_s: float = PERIOD_S) -> str:
    """What the loop read its batches from, and the declaration that gives it the ladder (empty when nothing was seen)."""
    if not calls:
        return ""
    lines = [f"  its loops spent their time (read every {1000 * period_s:.0f} ms from outside the script) in its own:"]
    lines += [f"    - {call.words()}" for call in calls]
    first = next((call for call in calls if call.feeds), None)
    if first is None:
        lines.append(
            "  None of them hands what it returns to another call of the loop, so fastpipe cannot tell which makes the "
            "batches: iterate a DataLoader over a dataset that declares its stages, fastpipe.stages.Stages(source=..., "
            "transforms=[...]) (see help(fastpipe.stages.Stages))"
        )
        return "\n".join(lines)
    replaced = f"the loop over {first.name}(...) at {first.call_site}" if first.generator else f"{first.name}(...) at {first.call_site}"
    lines += [
        f"  With no DataLoader workers behind it, the loop's time in {first.name} is time it waits for its data. If "
        f"{first.name} makes its batches, the ladder needs them from a DataLoader over a dataset that declares the steps "
        f"{first.name} runs (each a stage it can cache and time):",
        f"      class {_class_name(first.name)}(torch.utils.data.IterableDataset):  # what {first.name} makes, as a stream",
        "          def __init__(self):",
        f"              self.stages = fastpipe.stages.Stages(source=<the raw items {first.name} reads, re-iterable>, "
        f"transforms=[<each step {first.name} runs on one item>])",
        "          def __iter__(self):",
        "              return iter(self.stages)",
        f"      loader = torch.utils.data.DataLoader({_class_name(first.name)}(), batch_size=..., num_workers=2)  "
        f"# iterate it in place of {replaced}",
    ]
    return "\n".join(lines)


def _class_name(name: str) -> str:
    words = [w for w in name.replace("<", "").replace(">", "").split("_") if w]
    return "".join(w[:1].upper() + w[1:] for w in words) + "Stream" if words else "Stream"


def _short(filename: str) -> str:
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


_TREES: dict[str, ast.AST | None] = {}


def _tree(filename: str) -> ast.AST | None:
    tree = _TREES.get(filename, ...)
    if tree is ...:
        try:
            tree = ast.parse(Path(filename).read_text())
        except (OSError, SyntaxError, ValueError):
            tree = None
        _TREES[filename] = tree
    return tree  # type: ignore[return-value]


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _calls_name(call: ast.AST, name: str) -> bool:
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    return (isinstance(func, ast.Name) and func.id == name) or (isinstance(func, ast.Attribute) and func.attr == name)


def _feeds(filename: str, line: int, span: tuple[int, int], name: str) -> bool:
    """Whether the loop at ``span`` passes what the call of ``name`` at ``line`` returned (``X, Y = get_batch()``) or
    yielded (``for X, Y in batches()``) as an argument to another call in its body (``step(X, Y)``, ``model(X)``)."""
    tree = _tree(filename)
    if tree is None:
        return False
    made: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) != line:
            continue
        if isinstance(node, (ast.For, ast.AsyncFor)) and any(_calls_name(n, name) for n in ast.walk(node.iter)):
            made |= _names(node.target)
        elif (
            isinstance(node, (ast.Assign, ast.AnnAssign))
            and node.value is not None
            and any(_calls_name(n, name) for n in ast.walk(node.value))
        ):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                made |= _names(target)
    if not made:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and span[0] <= node.lineno <= span[1] and not _calls_name(node, name):
            used = (
                set().union(*(_names(a) for a in [*node.args, *(k.value for k in node.keywords)]))
                if (node.args or node.keywords)
                else set()
            )
            if used & made:
                return True
    return False


def _loop_around(code: CodeType, line: int) -> tuple[int, int] | None:
    """The first and last lines of the innermost ``for``/``while`` in ``code``'s file around ``line`` (None: no loop)."""
    tree = _tree(code.co_filename)
    if tree is None:
        return None
    best: tuple[int, int] | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.end_lineno is not None:
            if node.lineno <= line <= node.end_lineno and code.co_firstlineno <= node.lineno:
                if best is None or node.lineno >= best[0]:
                    best = (node.lineno, node.end_lineno)
    return best
