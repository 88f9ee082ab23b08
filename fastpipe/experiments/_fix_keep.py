"""Everything the user's loader did is kept, or the fix is refused: a candidate's loader against the original's.

A fix that rebuilds the loader (a ThreadLoader in place of the DataLoader, a new worker count, recycled batch memory)
or rewrites what the samples are (uint8 over the copy) can silently drop something the user's DataLoader call did:
a ``collate_fn`` that carries mixup/cutmix, a custom sampler or batch sampler, ``drop_last``, a ``worker_init_fn``
that seeds or opens files per worker, a seeded ``generator``, ``persistent_workers``, ``pin_memory``. A speed-up
measured without them is not the user's pipeline made faster: :func:`kept` compares the two loaders setting by
setting and says, for the first one the candidate cannot keep, why it is "not tried".

What counts as kept, and why:

* ``collate_fn``: the same function object (a rebuilt DataLoader, a RecycledLoader and a ThreadLoader that takes one
  all pass the user's own). A custom collate is also refused when the candidate changes the samples it receives
  (``changes_samples``: uint8 images where it saw normalized floats; mixup would raise or mix other values);
* ``batch_size``, ``drop_last``: equal; the sampler and a custom batch sampler: the same class (the candidate holds a
  copy, so iterating it moves none of the user's), which keeps ``shuffle``'s meaning (RandomSampler or not) too;
* ``generator``: absent in both, or present in both with the same initial seed;
* ``worker_init_fn``: the same function where the candidate runs workers; a candidate without worker processes (a
  ThreadLoader) cannot run it at all, so it is refused: what the function sets up per worker would be missing;
* ``persistent_workers``: kept where the candidate runs workers; a candidate without worker processes has nothing
  to keep alive between epochs, which is what the setting asks for;
* ``pin_memory``: equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data._utils.collate import default_collate

#: The DataLoader settings compared, in the order they are reported.
SETTINGS = (
    "collate_fn",
    "batch_size",
    "drop_last",
    "sampler",
    "batch_sampler",
    "generator",
    "worker_init_fn",
    "persistent_workers",
    "pin_memory",
)


@dataclass(frozen=True)
class Kept:
    """One setting of the original loader and whether the candidate keeps it."""

    setting: str
    kept: bool
    how: str
    """How it is kept, or why not (said in the report's "not tried" line)."""


def _name(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"{getattr(obj, '__module__', '') or ''}.{name}".lstrip(".")


def custom_collate(loader: Any) -> Any:
    """The loader's own ``collate_fn``, or None when it collates with ``default_collate`` (or has no setting)."""
    fn = getattr(loader, "collate_fn", None)
    if fn is None or fn is default_collate:
        return None
    return fn


def _workers(loader: Any) -> int:
    return int(getattr(loader, "num_workers", 0) or 0)


def _class(obj: Any) -> type | None:
    return None if obj is None else type(obj)


def _collate(original: Any, candidate: Any, changes_samples: str | None) -> Kept:
    mine = custom_collate(original)
    if mine is None:
        return Kept("collate_fn", True, "default_collate in both")
    theirs = custom_collate(candidate)
    if theirs is not mine:
        return Kept(
            "collate_fn",
            False,
            f"it cannot keep the loader's collate_fn ({_name(mine)}; mixup/cutmix lives there): "
            f"its loader ({type(candidate).__name__}) collates with {'default_collate' if theirs is None else _name(theirs)}",
        )
    if changes_samples:
        return Kept(
            "collate_fn",
            False,
            f"the loader's collate_fn ({_name(mine)}; mixup/cutmix lives there) would get {changes_samples}, "
            "where it got the original transform's output",
        )
    return Kept("collate_fn", True, f"the same {_name(mine)}")


def _same(setting: str, a: Any, b: Any) -> Kept:
    if a == b:
        return Kept(setting, True, f"{setting}={a!r} in both")
    return Kept(setting, False, f"it cannot keep {setting}={a!r} (its loader has {b!r})")


def _sampler(setting: str, original: Any, candidate: Any) -> Kept:
    a, b = getattr(original, setting, None), getattr(candidate, setting, None)
    if setting == "batch_sampler" and getattr(original, "batch_size", None) is not None:
        return Kept(setting, True, "the DataLoader's own BatchSampler over its sampler")  # made from batch_size/drop_last
    if _class(a) is _class(b):
        return Kept(setting, True, "none in both" if a is None else f"a copy of the loader's {type(a).__name__}")
    what = "none" if b is None else type(b).__name__
    return Kept(setting, False, f"it cannot keep the loader's {setting} ({type(a).__name__}): its loader has {what}")


def _generator(original: Any, candidate: Any) -> Kept:
    a, b = getattr(original, "generator", None), getattr(candidate, "generator", None)
    if a is None:
        return Kept("generator", True, "none in the original")
    if b is None:
        return Kept("generator", False, "it cannot keep the loader's seeded generator: its loader has none")
    if a.initial_seed() != b.initial_seed():
        return Kept("generator", False, f"its generator is seeded {b.initial_seed()}, the loader's {a.initial_seed()}")
    return Kept("generator", True, f"a copy of the loader's generator (seed {a.initial_seed()})")


def _worker_init(original: Any, candidate: Any) -> Kept:
    fn = getattr(original, "worker_init_fn", None)
    if fn is None or _workers(original) == 0:
        return Kept("worker_init_fn", True, "none that runs in the original")
    if _workers(candidate) == 0:
        return Kept(
            "worker_init_fn",
            False,
            f"it cannot keep the loader's worker_init_fn ({_name(fn)}): its loader ({type(candidate).__name__}) starts no "
            "worker processes to run it in, so what it sets up per worker would be missing",
        )
    if getattr(candidate, "worker_init_fn", None) is not fn:
        return Kept("worker_init_fn", False, f"it cannot keep the loader's worker_init_fn ({_name(fn)})")
    return Kept("worker_init_fn", True, f"the same {_name(fn)}")


def _persistent(original: Any, candidate: Any) -> Kept:
    wanted = bool(getattr(original, "persistent_workers", False)) and _workers(original) > 0
    if not wanted:
        return Kept("persistent_workers", True, "off in the original")
    if _workers(candidate) == 0:
        return Kept("persistent_workers", True, "its loader has no worker processes to keep alive between epochs")
    if not getattr(candidate, "persistent_workers", False):
        return Kept("persistent_workers", False, "it cannot keep persistent_workers=True")
    return Kept("persistent_workers", True, "on in both")


def compare_loaders(original: Any, candidate: Any, *, changes_samples: str | None = None) -> list[Kept]:
    """Each of :data:`SETTINGS` of ``original`` and whether ``candidate`` keeps it (see the module docstring).

    ``changes_samples``: what the candidate's samples become where the original's were its transform's output (e.g.
    "uint8 images (Normalize moved after the copy)"), or None when the samples are the same.
    """
    original, candidate = _inner(original), _inner(candidate)
    return [
        _collate(original, candidate, changes_samples),
        _same("batch_size", getattr(original, "batch_size", None), getattr(candidate, "batch_size", None)),
        _same("drop_last", bool(getattr(original, "drop_last", False)), bool(getattr(candidate, "drop_last", False))),
        _sampler("sampler", original, candidate),
        _sampler("batch_sampler", original, candidate),
        _generator(original, candidate),
        _worker_init(original, candidate),
        _persistent(original, candidate),
        _same("pin_memory", bool(getattr(original, "pin_memory", False)), bool(getattr(candidate, "pin_memory", False))),
    ]


def _inner(loader: Any) -> Any:
    """A RecycledLoader's own settings are its source DataLoader's (it reads them through); others as they are."""
    source = getattr(loader, "source", None)
    return source if source is not None and hasattr(source, "collate_fn") and hasattr(loader, "with_dataset") else loader


def refusal(original: Any, candidate: Any, *, changes_samples: str | None = None) -> str | None:
    """Why ``candidate`` is "not tried" (the first setting it cannot keep), or None when it keeps everything."""
    for item in compare_loaders(original, candidate, changes_samples=changes_samples):
        if not item.kept:
            return item.how
    return None


def kept_line(original: Any, candidate: Any) -> str:
    """The settings kept that the user set (not defaults), for a candidate's report line: ``"kept: collate_fn, ..."``."""
    notable = [
        k.setting
        for k in compare_loaders(original, candidate)
        if k.kept
        and not k.how.startswith(("default_collate", "none", "off in", "drop_last=False", "pin_memory=False"))
        and k.setting not in ("batch_size", "batch_sampler")
    ]
    return "kept: " + ", ".join(notable) if notable else ""
