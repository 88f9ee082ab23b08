"""One deprecation path for the entry points' old keywords (one release): ``diagnose(loader, step, "cpu", steps=4)``
still works, warns :class:`DeprecationWarning` naming the new spelling, and means ``diagnose(loader, step,
device="cpu", options=DiagnoseOptions(steps=4))``.

Written once, as a decorator, so every entry point maps its old keywords the same way and its signature
(``inspect.signature`` follows ``__wrapped__``) shows only the new parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _rebuilt(kind: type, given: Any, changes: dict[str, Any]) -> Any:
    """``given`` (an instance of ``kind``, of a dataclass sharing some of its fields, or None) with ``changes``."""
    if given is None:
        return kind(**changes)
    if isinstance(given, kind):
        return dataclasses.replace(given, **changes)
    names = {f.name for f in dataclasses.fields(kind)}
    kept = {f.name: getattr(given, f.name) for f in dataclasses.fields(given) if f.name in names}
    return kind(**{**kept, **changes})


def _spelled(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}=..." for name in values)


def moved_keywords(groups: dict[str, type], *, positional: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Accept, for one release, the keywords that moved into a parameter's dataclass, and positional arguments that
    became keyword-only.

    Args:
        groups: a parameter of the decorated function and the dataclass it takes, e.g. ``{"options":
            DiagnoseOptions, "train_state": TrainState}``: an old keyword named as one of that class's fields (and not
            a parameter of the function) is folded into the parameter's object (over the one given, if any).
        positional: the names, in order, of the parameters that used to be positional after the function's own
            positional ones (``("device",)``: ``diagnose(loader, step, "cpu")``).
    """

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        params = signature.parameters
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        n_positional = sum(1 for p in params.values() if p.kind in kinds)
        fields = {
            group: {f.name for f in dataclasses.fields(kind)} - set(params) for group, kind in groups.items()
        }  # fmt: skip
        name = func.__name__

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) > n_positional:
                extra = args[n_positional:]
                if len(extra) > len(positional):
                    raise TypeError(f"{name}() takes {n_positional} positional arguments but {len(args)} were given")
                for key, value in zip(positional, extra):
                    if key in kwargs:
                        raise TypeError(f"{name}() got multiple values for argument '{key}'")
                    kwargs[key] = value
                args = args[:n_positional]
                moved = positional[: len(extra)]
                warnings.warn(
                    f"{name}(): passing {', '.join(moved)} by position is deprecated; pass it by keyword: "
                    f"{name}(..., {_spelled(dict.fromkeys(moved))})",
                    DeprecationWarning,
                    stacklevel=2,
                )
            for group, kind in groups.items():
                old = {key: kwargs.pop(key) for key in list(kwargs) if key in fields[group]}
                if not old:
                    continue
                warnings.warn(
                    f"{name}({_spelled(old)}) is deprecated; pass {group}={kind.__name__}({_spelled(old)})",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[group] = _rebuilt(kind, kwargs.get(group), old)
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
