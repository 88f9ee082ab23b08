"""Objects that only pass their input through a chain they hold: a preset class, opened into its stages.

torchvision's reference ``presets.ClassificationPresetTrain`` is a plain class holding ``self.transforms =
Compose([...])`` whose ``__call__`` is ``return self.transforms(img)``; users' own presets and timm-style wrappers are
built the same way. Seen whole, such an object is one opaque stage, and every fix advised for it is a guess; opened,
the ladder gets a point per inner stage and the report names them.

Opening is only safe when calling the object is exactly calling what it holds: then replacing the dataset's
transform slot with the inner stages run in order (what the ladder's cache points and the stage timers do) gives the
model the same input. :func:`open_holder` therefore reads the method that runs (``__call__``, or ``forward`` for an
``nn.Module`` with no hooks) and opens the object only when its code is ``return self.<attr>(x)`` (or the same through
one local variable), with ``<attr>`` an attribute the object itself holds (not a property). Anything else (a
``__call__`` that converts, branches, loops over a list, or calls twice) stays one stage, as it was.
"""

from __future__ import annotations

import dis
from typing import Any, Sequence

import torch

#: Instructions that carry no meaning for the check (they differ between Python versions).
_IGNORED = frozenset({"RESUME", "PRECALL", "CACHE", "NOP", "PUSH_NULL", "KW_NAMES", "COPY_FREE_VARS", "EXTENDED_ARG"})
_ATTR = frozenset({"LOAD_METHOD", "LOAD_ATTR"})
_CALL = frozenset({"CALL", "CALL_FUNCTION", "CALL_METHOD"})
_LOCAL_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECKED", "LOAD_FAST_BORROW"})


def _method(obj: Any) -> Any:
    """The function that runs when ``obj`` is called: its class's ``__call__``, or ``forward`` for a module."""
    cls = type(obj)
    if isinstance(obj, torch.nn.Module):
        if type(obj).__call__ is not torch.nn.Module.__call__ or obj._forward_hooks or obj._forward_pre_hooks:
            return None  # hooks (or a __call__ of its own) run code the inner stages would not
        return getattr(cls, "forward", None)
    call = getattr(cls, "__call__", None)
    return call if call is not None and call is not object.__call__ else None


def delegated_attribute(obj: Any) -> str | None:
    """The attribute ``obj`` passes its input to when called, when that is all its call does; else None."""
    function = _method(obj)
    code = getattr(function, "__code__", None)
    if code is None or code.co_argcount < 2 or code.co_flags & (0x04 | 0x08):  # *args / **kwargs: not a plain call
        return None
    this, arg = code.co_varnames[0], code.co_varnames[1]
    ops = [(i.opname, i.argval) for i in dis.get_instructions(function) if i.opname not in _IGNORED]
    head = ops[:4]
    if len(head) < 4 or head[0][0] not in _LOCAL_LOADS or head[0][1] != this:
        return None
    if head[1][0] not in _ATTR or head[2][0] not in _LOCAL_LOADS or head[2][1] != arg:
        return None
    if head[3][0] not in _CALL or head[3][1] != 1:
        return None
    tail = ops[4:]
    plain = tail == [("RETURN_VALUE", None)]
    through_local = len(tail) == 3 and tail[0][0] == "STORE_FAST" and tail[1][0] in _LOCAL_LOADS and tail[1][1] == tail[0][1]
    through_local = through_local and tail[2] == ("RETURN_VALUE", None)
    return str(head[1][1]) if plain or through_local else None


def open_holder(obj: Any) -> Sequence[Any] | None:
    """``[inner]`` when calling ``obj`` only calls ``inner``, an attribute it holds itself; None to keep ``obj`` whole.

    The caller flattens ``inner`` further (a Compose into its stages, another holder into its own).
    """
    if isinstance(obj, type) or not callable(obj):
        return None
    attr = delegated_attribute(obj)
    if attr is None:
        return None
    own = getattr(obj, "__dict__", None)
    inner = own.get(attr) if isinstance(own, dict) else None
    if inner is None and isinstance(obj, torch.nn.Module):
        inner = obj._modules.get(attr)  # a module keeps its submodules in _modules, not in __dict__
    if inner is None or inner is obj or not callable(inner):
        return None
    return [inner]
