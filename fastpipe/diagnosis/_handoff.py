"""The rendezvous between the ladder and a running script's loop: one batch handed over per ``next()``.

In script mode (:mod:`fastpipe.diagnosis._script`) the ladder runs in a thread of its own while the script's loop
runs in the main thread. The ladder's "step" is :meth:`Handoff.step`: it hands a batch to the script and returns when
the script asks for the next one, i.e. when the script's own step (model, loss, optimizer, logging) is done. The two
threads never run at once (each waits for the other), so the loop keeps its serial order and the time between two of
the ladder's marks is the time between two of the loop's ``next()`` calls: fetching the point's batch, then the
script's step.

A step is *spoiled* when the script did something else between taking its batch and asking for the next one:
iterating another DataLoader (validation) or starting a new epoch. That interval holds more than one training step,
so the ladder drops it (:mod:`fastpipe.diagnosis._windows`).
"""

from __future__ import annotations

import threading
from typing import Any


class ScriptGone(KeyboardInterrupt):
    """The script stopped asking for batches (it ended, raised, or was interrupted) while the ladder ran.

    A KeyboardInterrupt, so the engine stops as on Ctrl-C and reports what it measured so far.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class EngineStopped(KeyboardInterrupt):
    """Raised inside the engine's thread when the script is gone and the engine, in a pass that takes no step of the
    script (the loader's memory pass, the start-up pass), has not noticed: it stops there as on a Ctrl-C in factory mode."""


class StepBudgetSpent(KeyboardInterrupt):
    """The ladder used the most steps it was allowed to take from the script (``--budget-steps``; ``--budget`` is seconds
    per cache point). The engine stops as on Ctrl-C and reports what it has; script mode then words it as a budget
    stop, not an interruption (:attr:`Handoff.spent`)."""


class Handoff:
    """One slot between the engine thread (:meth:`step`) and the script's thread (:meth:`request`)."""

    def __init__(self, budget_steps: int | None = None) -> None:
        self._cond = threading.Condition()
        self._slot: Any = None
        self._given = 0  # batches put in the slot
        self._requests = 0  # next() calls of the script
        self._gone: str | None = None
        self._outcome: tuple[Any, BaseException | None] | None = None
        self._busy = False  # the script did other work since it took the last batch
        self.last_spoiled = False
        self.budget_steps = budget_steps
        """The most steps the engine may take (None: no cap; each point's time budget bounds the ladder instead). The
        runner lifts it once the points are measured, so the in-worker timing is never cut short by it."""
        self.spent = False
        """Whether :class:`StepBudgetSpent` was raised: the ladder stopped at its step cap."""
        self.steps = 0
        self.spoiled = 0

    # ----- the engine's side ---------------------------------------------------------------
    def step(self, batch: Any) -> None:
        """Give ``batch`` to the script's waiting ``next()``; return once the script asks for the next batch."""
        with self._cond:
            if self._gone is not None:
                raise ScriptGone(self._gone)
            if self.budget_steps is not None and self.steps >= self.budget_steps:
                self.spent = True
                raise StepBudgetSpent(f"the ladder took the {self.budget_steps} steps of its budget")
            self.steps += 1
            self._given += 1
            self._slot, self._busy = batch, False
            self._cond.notify_all()
            while self._requests <= self._given and self._gone is None:
                self._cond.wait()
            if self._requests <= self._given:
                raise ScriptGone(self._gone or "the script stopped")
            self.last_spoiled = self._busy
            self.spoiled += self._busy

    def finish(self, result: Any, error: BaseException | None = None) -> None:
        """The engine is done (a report, or the error that stopped it): wake the script's waiting ``next()``."""
        with self._cond:
            self._outcome = (result, error)
            self._cond.notify_all()

    # ----- the script's side ---------------------------------------------------------------
    def request(self) -> tuple[bool, Any]:
        """The script's ``next()``: ``(True, batch)``, or ``(False, None)`` once the engine has finished."""
        with self._cond:
            self._requests += 1
            wanted = self._requests
            self._cond.notify_all()
            while self._given < wanted and self._outcome is None:
                self._cond.wait()
            if self._given < wanted:
                return False, None
            batch, self._slot = self._slot, None
            return True, batch

    def script_busy(self) -> bool:
        """Whether the script is in its own step (it took its batch and has not asked for the next): the engine waits on
        it then, so the script's thread may touch the state the engine also restores. Lock-free (a signal handler asks)."""
        return self._given > 0 and self._requests == self._given and self._outcome is None

    def elsewhere(self) -> None:
        """The script started other work (another loader, a new epoch) between two batches: that step is spoiled."""
        with self._cond:
            self._busy = True

    def gone(self, why: str) -> None:
        """The script will ask for no more batches: a waiting engine step raises :class:`ScriptGone`."""
        with self._cond:
            if self._gone is None:
                self._gone = why
            self._cond.notify_all()

    @property
    def is_gone(self) -> bool:
        """Whether the script said it will ask for no more batches."""
        return self._gone is not None

    @property
    def gone_why(self) -> str | None:
        """Why the script stopped asking for batches (None while it still asks)."""
        with self._cond:
            return self._gone

    def wait_outcome(self, timeout: float | None = None) -> tuple[Any, BaseException | None] | None:
        """The engine's ``(report, error)``, once it has finished (None if ``timeout`` passed first)."""
        with self._cond:
            self._cond.wait_for(lambda: self._outcome is not None, timeout)
            return self._outcome
