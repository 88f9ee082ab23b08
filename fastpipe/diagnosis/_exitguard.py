"""Put a script's state back before its own exit handlers read it, when it leaves in the middle of the ladder.

In script mode (:mod:`fastpipe.diagnosis._script`) the script trains on replayed batches while the ladder runs, and
its state is put back when the ladder ends. A script that crashes, calls ``sys.exit`` or gets a Ctrl-C during the
ladder unwinds through its own handlers first (``finally:``, ``except: save(); raise``, a ``with`` block's exit),
before fastpipe sees the exception: a save-on-exit handler wrote the ladder's weights, trained on replayed batches.

Two ways in, both only in the script's thread and only while the ladder runs:

* a ``state_dict`` pre-hook on each of the script's modules (every submodule: a script saves ``model.module`` or
  ``model.backbone`` too) and optimizers: when one is read with an exception in flight (``sys.exc_info()``, set in an
  ``except:``, a ``finally:`` and a ``with`` block's exit while an exception unwinds), the state is put back first, so
  the checkpoint holds the script's own state. The same after an epoch ended during the ladder, before the script
  asks for its next batch (its end-of-epoch checkpoint). Read in the normal course of a step (an EMA update reads
  the model's ``state_dict`` every step) nothing happens;
* a SIGINT handler: a Ctrl-C that lands in the script's step (the engine waits on it) puts everything back, RNGs
  included, before Python's own handler raises ``KeyboardInterrupt`` into the script. A Ctrl-C that lands while the
  script waits for its batch is handled where it waits (the report first, then the script unwinds).

What it cannot see: a handler that saves state without ``state_dict`` (pickling the whole module, reading the RNGs
before the model) after a crash rather than a Ctrl-C; the report's notes say the state is put back on the way out.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Callable

from torch import nn

from fastpipe.diagnosis._trainstate import TrainingState


class ExitGuard:
    """The hooks and the SIGINT handler above, installed for the ladder's span; :meth:`close` removes them."""

    def __init__(
        self,
        found: TrainingState,
        on_read: Callable[[BaseException | None], None],
        on_interrupt: Callable[[], None],
        *,
        busy: Callable[[], bool],
    ) -> None:
        """``on_read(exc)``: the script's thread reads its state (``exc``: the exception in flight, or None);
        ``on_interrupt()``: a Ctrl-C arrived while ``busy()`` (the script is in its own step and the engine waits on it,
        so a restore there is safe), before Python raises KeyboardInterrupt in the script."""
        self.on_read, self.on_interrupt, self.busy = on_read, on_interrupt, busy
        self.thread = threading.get_ident()
        self.handles: list[Any] = []
        modules = {id(m): m for root in found.modules for m in root.modules()}
        for module in modules.values():
            self.handles.append(module.register_state_dict_pre_hook(self._module_hook))
        self.optimizer_steps = 0
        """Steps the script's optimizers took (a restore is needed again only once something trained)."""
        for optimizer in found.optimizers:
            self.handles.append(optimizer.register_state_dict_pre_hook(self._optimizer_hook))
            self.handles.append(optimizer.register_step_post_hook(self._stepped))
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):  # not SIG_IGN (the script ignores Ctrl-C) nor SIG_DFL (the process dies at once)
                self.previous = previous
                signal.signal(signal.SIGINT, self._on_sigint)

    def _read(self) -> None:
        if threading.get_ident() == self.thread:  # not the engine's own snapshots
            self.on_read(sys.exc_info()[1])

    def _module_hook(self, module: nn.Module, prefix: str, keep_vars: bool) -> None:
        self._read()

    def _optimizer_hook(self, optimizer: Any) -> None:
        self._read()

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.busy():
            self.on_interrupt()
        self.previous(signum, frame)

    def close(self) -> None:
        """Remove the hooks; give SIGINT back its handler (unless the script has set its own since)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.previous is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, self.previous)
            self.previous = None
