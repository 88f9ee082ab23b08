"""Script mode: ``fastpipe diagnose -- python train.py ARGS`` runs the cache ladder inside an unmodified script's loop.

The script runs in this process as ``python train.py ARGS`` would (its ``sys.argv``, its folder first on
``sys.path``, ``__name__ == "__main__"``), with ``DataLoader.__iter__`` tapped (:mod:`fastpipe.monitor._tap`; the
wrappers of Lightning, accelerate and timm iterate a DataLoader inside, so they are tapped too). Its loaders run
untouched until the training loader has delivered ``start_after`` batches in an epoch: ``--loader N``, else the one
with the longest epoch among those the script holds (:mod:`fastpipe.diagnosis._trainloader`: a validation or
warm-up loader iterated first is passed over). At its next ``next()`` the ladder takes over:

* the script's model, optimizers, LR schedulers and GradScalers are found among the live objects
  (:mod:`fastpipe.diagnosis._trainstate`) and snapshotted with the RNGs and the loader's generators;
* the engine (:func:`fastpipe.diagnosis._diagnose.diagnose`, the factory's, with the same plan, noise rules,
  remeasurement, saturated split and in-worker costs) runs in a thread; its step is the
  :class:`~fastpipe.diagnosis._handoff.Handoff`, so every ``next()`` of the script gets a batch of the point being
  measured and the script's real step (model, loss, amp, optimizer, schedulers, clipping, logging) is what is timed
  (:class:`~fastpipe.diagnosis._windows.WindowRunner`);
* the script's iterator of the real loader is held where it was, its workers idle;
* the script's epochs are kept: an epoch still ends after ``len(loader)`` batches (``StopIteration``, as the real
  loader's), and the script begins the next as it always does; the ladder's windows go on in it, without the
  steps that spanned the epoch's end. The script's state is put back before its end-of-epoch work (validation, a
  checkpoint), so what it saves there is its own;
* the loop's own work on each batch before its model runs is timed by a forward pre-hook on the models found
  (:mod:`fastpipe.diagnosis.unseen._loop_work`), removed when the ladder ends, and added to the report's
  main-process section (named as a stage when it costs the step).

When the report is ready everything found is put back, the report is printed, and then either the script is stopped
(the default, a dry run: :class:`StopScript`, a ``SystemExit(0)`` raised from its ``next()``, which unwinds it as
``sys.exit`` would, after its model was put back) or, with ``then_continue``, its ``next()`` carries on with the held
real iterator: from the batch it would have had next, up to the length of the epoch it is in. If the script ends,
raises or is interrupted during the ladder, its state is put back before its own exit handlers read it
(:mod:`fastpipe.diagnosis._exitguard`), the engine stops as on Ctrl-C and the partial report is printed.
"""

from __future__ import annotations

import functools
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis._exitguard import ExitGuard
from fastpipe.diagnosis._handoff import EngineStopped, Handoff, ScriptGone, StepBudgetSpent
from fastpipe.diagnosis._script_budget import LadderEstimate, LadderProgress, duration
from fastpipe.diagnosis._trainloader import Choice, HeldLoaders, epoch_length
from fastpipe.diagnosis._trainstate import TrainingState, find_training_state
from fastpipe.diagnosis._windows import ScriptDevice, WindowRunner
from fastpipe.diagnosis.ladder._plan import point_label
from fastpipe.diagnosis.runtime._snapshot import UserState
from fastpipe.diagnosis.runtime._threads import one_intraop_thread_here
from fastpipe.diagnosis.unseen._loop_work import LoopTimer, LoopWork
from fastpipe.diagnosis.verdict._main_process import add_loop_work
from fastpipe.diagnosis.verdict._report import Report
from fastpipe.errors import ConfigError, FastpipeError
from fastpipe.loading._pinning import shutdown_iterator
from fastpipe.monitor import LoopSampler, Watch, no_loader_text, tap_dataloaders
from fastpipe.workloads._workload import Workload

START_AFTER = 5
"""Batches a loader delivers in an epoch before the ladder takes it over (the first steps start the workers and
warm the caches; a framework's sanity check reads two validation batches first)."""
DEFAULT_BUDGET_S = 20.0
"""Seconds of measuring each cache point may take before it stops short of its precision target (``--budget``): the
factory's default. The ladder's length follows from it and the script's step time (:mod:`fastpipe.diagnosis._script_budget`)."""
EXIT_INTERRUPTED = 130
EXIT_NOTHING = 2
ENGINE_EXIT_WAIT_S = 60.0
"""How long the script's end waits for the engine to wrap up its partial report (closing a point's workers)."""
ENGINE_NUDGE_S = 1.0
"""After this long without the engine's outcome once the script is gone, the engine is stopped where it is
(:class:`~fastpipe.diagnosis._handoff.EngineStopped`): a pass that takes no step of the script does not see it go."""
ENGINE_SLOW_S = 5.0
"""After this long more, the wait is said on stderr."""

CPU_STEP_CAVEAT = (
    "the script's own training step ran on the CPU (its model is on the CPU: no accelerator here, or the script chose "
    "none). The device point is that CPU step, and it shares the cores with the loader's workers: a stage that burns "
    "CPU can look cheaper or dearer than it would beside an accelerator's step, which leaves the cores to the loader. "
    "This verdict is about this CPU run; --device sim:MS cannot stand in for a step fastpipe does not own. The real "
    "answer needs the accelerator: run the same command where the script trains on its GPU"
)


class StopScript(SystemExit):
    """fastpipe stopping the script after its report (the dry run), raised from the script's ``next()``."""


@dataclass
class ScriptOptions:
    """Script mode's settings; the ladder's own are the factory's (``fastpipe diagnose`` flags)."""

    loader: int | None = None
    """Which DataLoader is the training one, 1 for the first the script iterated (None: the one with the longest epoch,
    :mod:`fastpipe.diagnosis._trainloader`)."""
    start_after: int = START_AFTER
    budget_s: float = DEFAULT_BUDGET_S
    """Seconds of measuring per cache point before it stops short of the precision target (``--budget``, as a factory's)."""
    budget_steps: int | None = None
    """The most steps of the script's loop the whole ladder may take (``--budget-steps``; None: no cap, each point's
    ``budget_s`` bounds the ladder). A ladder that reaches it stops at its budget: the report says so, not "interrupted"."""
    progress: bool = True
    """Progress lines on stderr as each point starts (``--no-progress`` turns them off)."""
    then_continue: bool = False
    device: str | None = None
    steps: int = 10
    warmup: int = 3
    pool: int | None = None
    threshold: float = 0.05
    precision: float = 0.03
    strategy: str = "linear"
    stage_costs: bool = True
    loader_memory: bool = False
    fix: str | None = None
    """None: the ladder only; ``"after"``: the ladder, then the fixes (``diagnose -- ... --fix``); ``"only"``: the fixes
    only (``fastpipe fix -- python train.py``). The fixes are measured in the script's loop too
    (:mod:`fastpipe.experiments._script_fix`)."""
    fix_budget_s: float | None = None
    """Seconds of measuring per fix rung (None: ``budget_s``)."""

    def check(self) -> None:
        if not self.budget_s > 0:
            raise ConfigError(
                "--budget is the seconds of measuring each cache point may take before it stops short of its precision "
                f"target (as with a factory; default {DEFAULT_BUDGET_S:g}), a positive number. Got {self.budget_s}."
            )
        if self.budget_steps is not None and self.budget_steps < 1:
            raise ConfigError(
                f"--budget-steps is the most steps of the script the ladder may take, a positive number. Got {self.budget_steps}."
            )
        if self.loader is not None and self.loader < 1:
            raise ConfigError(f"--loader counts the script's DataLoaders from 1, in the order it first iterates them. Got {self.loader}.")
        if self.start_after < 1:
            raise ConfigError(f"the ladder starts after at least 1 real batch. Got {self.start_after}.")
        if self.fix not in (None, "after", "only"):
            raise ConfigError(f"fix is None, 'after' or 'only'. Got {self.fix!r}.")
        if self.fix is not None and self.budget_steps is not None:
            raise ConfigError(
                "--budget-steps caps the cache ladder's steps; the fixes are bounded by --budget (seconds per rung, "
                "--fix-budget with diagnose --fix): drop --budget-steps"
            )
        if self.device is not None and self.device.startswith("sim"):
            raise ConfigError(
                f"--device {self.device} replaces the step's time only where fastpipe owns the step; in script mode the "
                "script's own step runs (on the device its model is on): drop --device, or use a factory "
                "(fastpipe diagnose module:make_workload --device sim:MS)"
            )


@dataclass
class _Seen:
    """A DataLoader the script iterated: its label, its watch (the real loop's timing) and its batches this epoch."""

    loader: DataLoader
    label: str
    index: int
    watch: Watch
    batches: int = 0
    most: int = 0
    """The most batches it delivered in one epoch."""
    total: int = 0
    """Batches it delivered in all."""
    choice: Choice | None = None
    """This epoch's answer to "is it the training loader?" (asked once an epoch, at its ``start_after``-th batch)."""
    passed_over: dict[int, int] | None = None
    """When it was passed over for longer loaders: their ids and the batches they had delivered then."""
    second_epoch: bool = False
    """It begins another epoch, passed over before, and the longer loaders delivered nothing since."""


class _ScriptIterator(Iterator[Any]):
    """What the script's ``iter(loader)`` returns: the real iterator, or the ladder's batches while it runs.

    It counts the batches it hands out (``count``) against the epoch's length (``cap``: ``len(loader)``, which the
    sampler, ``drop_last`` and a DistributedSampler's share are in; None for a stream without ``__len__``), so that
    once the ladder has taken over, an epoch still ends after exactly ``len(loader)`` batches, as the real loader's
    would: a script that schedules by it (OneCycleLR, warm-up, gradient accumulation, "the last batch of the epoch")
    sees the epochs it asked for.
    """

    def __init__(
        self, session: "ScriptLadder", seen: _Seen, real: Iterator[Any] | None, *, cap: int | None, fresh: Callable[[], Iterator[Any]]
    ) -> None:
        self.session, self.seen, self.real = session, seen, real
        self.cap, self.fresh = cap, fresh
        self.count = 0
        self.ended = False
        self.from_held = False

    def __iter__(self) -> "_ScriptIterator":
        return self

    def __next__(self) -> Any:
        return self.session.next_batch(self)

    def __len__(self) -> int:
        return len(self.seen.loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("session", "seen", "real", "cap", "fresh", "count", "ended", "from_held") or self.real is None:
            raise AttributeError(name)
        return getattr(self.real, name)


@dataclass(frozen=True)
class FixHooks:
    """What script mode needs to measure fixes in the script's loop (``fix`` set): :mod:`fastpipe.experiments._script_fix`
    provides them. They are handed in by the command, since the experiments are a layer above the diagnosis, which
    must not import them."""

    announcement: Callable[..., str]
    """``announcement(script, label, loader, why, options)``: what is said as the fixes take over the loop."""
    progress_runner: Callable[..., Any]
    """``progress_runner(make, echo)``: the window-runner factory, saying which rung it measures."""
    script_fixes: Callable[..., Any]
    """``script_fixes(workload, device, options, *, runner, script, named)``: the fixes built, checked and measured."""


class ScriptLadder:
    """One script's run: the tap's callbacks, the handover to the ladder, and its outcome."""

    def __init__(
        self,
        options: ScriptOptions,
        *,
        script: str,
        echo: Callable[[str], None],
        show: Callable[[Report], None],
        fix_hooks: FixHooks | None = None,
    ) -> None:
        if options.fix is not None and fix_hooks is None:
            raise ValueError("ScriptLadder: fix needs fix_hooks (fastpipe.experiments._script_fix.HOOKS)")
        self.options, self.script, self.echo, self.show = options, script, echo, show
        self.fix_hooks = fix_hooks
        self.seen: dict[int, _Seen] = {}
        self.held_loaders = HeldLoaders()
        self.sampler: LoopSampler | None = None
        """Where the script's main thread is, until it iterates a DataLoader (what its loop reads when it iterates none)."""
        self.state = "before"  # then "ladder", then "after"
        self.trained: _Seen | None = None
        self.held: Iterator[Any] | None = None
        self.handoff: Handoff | None = None
        self.thread: threading.Thread | None = None
        self.found: TrainingState | None = None
        self.loop: LoopTimer | None = None
        self.loop_work: LoopWork | None = None
        self.epochs: list[tuple[Any, int]] = []
        self.device: Device | None = None
        self.before: Any = None
        self.estimate: LadderEstimate | None = None
        """How long the ladder should take, from the real loop's step time (printed in the announcement)."""
        self.runner: WindowRunner | None = None
        self.started_at = 0.0
        self.report: Report | None = None
        self.error: BaseException | None = None
        self.code: int | None = None
        """The exit code fastpipe decided (a stop, an interrupt); None: the script's own."""
        self.saved: list[UserState] = []
        """The script's state when the ladder took over, in host memory (one more copy than the engine's own): put back
        in place at each epoch end during the ladder and on the script's way out (:meth:`_put_back`)."""
        self.guard: ExitGuard | None = None
        self.put_back_for: tuple[Any, ...] | None = None
        """Why and at which ladder step the state was last put back (:meth:`_put_back` does it once for each)."""
        self.epoch_ends = 0
        """Epochs of the training loader that ended during the ladder."""
        self.epoch_ended = False
        """An epoch of the training loader ended during the ladder, and the script has not asked for a batch since."""
        self.nudged = False
        """The engine was stopped where it was (:data:`ENGINE_NUDGE_S`)."""
        self.fix_report: Any = None
        """The fixes measured after the ladder (``diagnose --fix``), or why they were not (an exception)."""

    # ----- the tap's side ------------------------------------------------------------------
    def select(self, loader: DataLoader) -> Watch | None:
        if threading.current_thread().name.startswith("fastpipe"):
            return None  # the engine's own loaders (each cache point's) are not the script's
        seen = self.seen.get(id(loader))
        if self.sampler is not None:
            self.sampler.stop()  # a DataLoader: the ladder's own measure from here on
        if seen is None:
            index = len(self.seen) + 1
            seen = _Seen(loader, f"DataLoader #{index}", index, Watch(loader, echo=False, memory=False, hint=False))
            self.seen[id(loader)] = seen
        if self.state == "ladder" and self.handoff is not None:
            self._epoch_work()
            self.handoff.elsewhere()  # a new epoch or another loader between two steps: that step holds more
            if self.loop is not None:
                self.loop.elsewhere()
        return seen.watch

    def source(self, loader: DataLoader, original: Callable[[DataLoader], Iterator[Any]]) -> Iterator[Any]:
        seen = self.seen[id(loader)]
        seen.batches = 0
        if seen.choice is not None and not seen.choice.chosen and seen.passed_over is not None:
            seen.second_epoch = all(self._delivered(i) == n for i, n in seen.passed_over.items())
        seen.choice = None
        cap, fresh = epoch_length(loader), functools.partial(original, loader)
        if seen is self.trained and self.state == "ladder":
            return _ScriptIterator(self, seen, None, cap=cap, fresh=fresh)  # a new epoch while the ladder runs: it goes on
        return _ScriptIterator(self, seen, fresh(), cap=cap, fresh=fresh)

    # ----- the script's next() -------------------------------------------------------------
    def next_batch(self, it: _ScriptIterator) -> Any:
        if self.state == "before" and it.real is not None and self._due(it.seen):
            self._start(it)
        if it.seen is self.trained and self.state != "before":
            return self._trained_batch(it)
        assert it.real is not None
        return self._counted(it, next(it.real))

    def _counted(self, it: _ScriptIterator, batch: Any) -> Any:
        it.count += 1
        it.seen.batches += 1
        it.seen.total += 1
        it.seen.most = max(it.seen.most, it.seen.batches)
        return batch

    def _trained_batch(self, it: _ScriptIterator) -> Any:
        """The training loader's ``next()`` once the ladder has taken over: the ladder's batches while it runs, the real
        ones after it (``--then-continue``); either way the epoch ends after ``len(loader)`` batches."""
        if it.ended or (it.cap is not None and it.count >= it.cap):
            self._end_epoch(it)
            raise StopIteration
        if self.state == "ladder":
            ok, batch = self._serve()
            if ok:
                return self._counted(it, batch)
        elif not self.options.then_continue:
            raise StopScript(self.code or 0)  # the dry run is over: a script that caught the stop is stopped again
        return self._real_after(it)

    def _real_after(self, it: _ScriptIterator) -> Any:
        """A real batch after the ladder: from the held iterator (the batches the script would have had next), then, if
        it runs out before this epoch's length (the ladder ended in a later epoch), from a fresh epoch of the loader."""
        while True:
            if it.real is None or it.real is self.held:
                if self.held is not None:
                    it.real, self.held, it.from_held = self.held, None, True
                else:
                    it.real, it.from_held = it.fresh(), False
            try:
                return self._counted(it, next(it.real))
            except StopIteration:
                short = it.from_held and it.cap is not None and it.count < it.cap
                it.real, it.from_held = None, False
                if not short:
                    it.ended = True
                    raise

    def _end_epoch(self, it: _ScriptIterator) -> None:
        """The epoch's last batch was handed out: end it as the real loader would. During the ladder the script's state
        is put back first, so its end-of-epoch work (validation, a checkpoint) sees its own model, not the ladder's;
        and once more when that work begins (:meth:`_epoch_work`): a wrapper that prefetches (timm's PrefetchLoader)
        asked for the next batch before handing the script its last, which the script trained on after this."""
        it.ended = True
        if self.state == "ladder":
            self.epoch_ends += 1
            self.epoch_ended = True
            self._put_back("epoch end")
        real, it.real = it.real, None
        if real is not None and real is not self.held:  # the held one waits for --then-continue (or its release)
            shutdown_iterator(real)  # what is left of a real epoch after the ladder is not this epoch's

    def _due(self, seen: _Seen) -> bool:
        if seen.batches < self.options.start_after:
            return False
        if self.options.loader is not None:
            return seen.index == self.options.loader
        if seen.choice is None:  # once an epoch: a scan of the live objects
            labels = {key: s.label for key, s in self.seen.items()}
            seen.choice = self.held_loaders.choose(seen.loader, second_epoch=seen.second_epoch, labels=labels)
            if not seen.choice.chosen:
                seen.passed_over = {id(o): self._delivered(id(o)) for o in seen.choice.longer}
        return seen.choice.chosen

    def _delivered(self, key: int) -> int:
        seen = self.seen.get(key)
        return 0 if seen is None else seen.total

    # ----- the handover ----------------------------------------------------------------------
    def _start(self, it: _ScriptIterator) -> None:
        options, seen = self.options, it.seen
        self.trained, self.held = seen, it.real
        self.before = seen.watch.ledger.current(time.perf_counter())
        samplers = (getattr(seen.loader, "sampler", None), getattr(getattr(seen.loader, "batch_sampler", None), "sampler", None))
        # a DistributedSampler's epoch: a framework whose epochs end by count calls set_epoch during the ladder
        self.epochs = [(s, s.epoch) for s in samplers if isinstance(getattr(s, "epoch", None), int)]
        self.found = find_training_state()
        self.device = self._device(self.found)
        self.loop = LoopTimer(self.found.modules, self.device.torch_device if self.device.kind == "cuda" else None)
        self.handoff = Handoff(options.budget_steps)
        optimizers, scalers = self.found.optimizers, self.found.scalers
        workload = Workload(
            loader=seen.loader,
            step=self.handoff.step,
            model=self.found.model,
            optimizer=optimizers[0] if optimizers else None,
            schedulers=list(self.found.schedulers),
            scaler=scalers[0] if scalers else None,
            name=f"{Path(self.script).name} ({seen.label})",
        )
        extras = [UserState(optimizer=o) for o in optimizers[1:]] + [UserState(scaler=s) for s in scalers[1:]]
        self.saved = [
            UserState(workload.model, workload.optimizer, seen.loader, schedulers=workload.schedulers, scaler=workload.scaler),
            *extras,
        ]
        self.guard = ExitGuard(
            self.found, self._state_read, self._interrupted, busy=lambda: self.handoff is not None and self.handoff.script_busy()
        )
        self.echo(self._announcement(seen))
        self.state = "ladder"
        self.started_at = time.perf_counter()
        self.thread = threading.Thread(target=self._engine, args=(workload, extras), name="fastpipe-ladder", daemon=True)
        self.thread.start()

    def _device(self, found: TrainingState) -> Device:
        where = found.device()
        asked = self.options.device
        if where is None:
            return parse_device(asked or "cpu")
        device = parse_device(str(where) if where.type != "cuda" or where.index is None else f"cuda:{where.index}")
        if asked is not None and parse_device(asked).kind != device.kind:
            self.echo(f"fastpipe diagnose: note: --device {asked} ignored: the script's model is on {where}, where its step runs")
        return device

    def _announcement(self, seen: _Seen) -> str:
        o = self.options
        if o.fix == "only":
            assert self.fix_hooks is not None
            why = f"--loader {o.loader}" if o.loader else (seen.choice.why if seen.choice else "the first")
            return self.fix_hooks.announcement(self.script, seen.label, seen.loader, why, self._fix_options())
        stop = (
            "then the script goes on with its real batches, from the one it would have had next"
            if o.then_continue
            else "then the script is stopped (a dry run; --then-continue resumes its training on the real loader instead)"
        )
        why = (
            f"--loader {o.loader}"
            if o.loader
            else f"the training loader: {seen.choice.why if seen.choice else 'the first'}; --loader N picks the Nth the script iterates"
        )
        self.estimate = LadderEstimate.from_loop(
            seen.loader,
            self.before,
            budget_s=o.budget_s,
            warmup=o.warmup,
            steps=o.steps,
            stage_costs=o.stage_costs,
            memory_pass=o.loader_memory,
            recent_own_s=seen.watch.ledger.recent_own_s,
        )
        cap = f" (and at most {o.budget_steps} steps in all, --budget-steps)" if o.budget_steps is not None else ""
        return (
            f"fastpipe diagnose: the cache ladder starts in {self.script}'s loop at batch {seen.batches + 1} of "
            f"{seen.label} (batch_size={seen.loader.batch_size}, num_workers={seen.loader.num_workers}; {why}). At each cache "
            f"point the script trains on replayed batches, not on its data, until the point's step time is within "
            f"{o.precision:.0%} (--precision) or {o.budget_s:g} s pass (--budget){cap}. {self.estimate.text(o.precision)}. "
            f"Afterwards {self.found.describe() if self.found else 'its state'}, the RNGs and the loader's state are put back "
            f"as they are now; {stop}"
        )

    def _engine(self, workload: Workload, extras: list[UserState]) -> None:
        from fastpipe.diagnosis._diagnose import run_diagnosis
        from fastpipe.diagnosis._options import DiagnoseOptions

        assert self.handoff is not None and self.device is not None
        _block_interrupts()
        one_intraop_thread_here()  # no second OpenMP team beside the script's: its CPU step keeps its own regime
        o, report, error = self.options, None, None
        try:
            if o.fix == "only":
                report = self._fixes(workload, None)
                return
            options = DiagnoseOptions(
                steps=o.steps,
                warmup=o.warmup,
                pool=o.pool,
                threshold=o.threshold,
                strategy=o.strategy,
                budget=o.budget_s,
                precision=o.precision,
                progress=False,  # the factory's live bar would draw over the script's output: LadderProgress's lines instead
                stage_costs=o.stage_costs,
                loader_memory=o.loader_memory,
                startup=False,  # as before this change: script mode does not run the start-up pass
            )
            report = run_diagnosis(
                workload,
                ScriptDevice(self.device),
                options,
                runner=self._runner,
                on_warning=lambda text: self.echo(f"fastpipe: warning: {text}"),
            )
            if o.fix == "after" and report is not None and report.experiments and not report.interrupted:
                try:
                    self.fix_report = self._fixes(workload, [b.stage for b in report.bottlenecks])
                except Exception as exc:  # noqa: BLE001 - the ladder's report stands; the fixes' failure is said
                    self.fix_report = exc
                except KeyboardInterrupt as exc:  # the script went, or Ctrl-C: the ladder's report stands
                    self.fix_report = exc
        except BaseException as exc:  # handed to the script's thread, which reports it
            error = exc
        finally:
            try:
                for state in extras:
                    state.restore()
            finally:
                while True:  # an EngineStopped that lands here must not lose the outcome the script's thread waits for
                    try:
                        self.handoff.finish(report, error)
                        break
                    except KeyboardInterrupt:
                        continue

    def _fix_options(self) -> Any:
        from fastpipe.diagnosis._options import MeasureOptions

        o = self.options
        return MeasureOptions(steps=o.steps, warmup=o.warmup, budget=o.fix_budget_s or o.budget_s, precision=o.precision)

    def _fixes(self, workload: Workload, named: list[str] | None) -> Any:
        """The fixes measured in the script's loop (:mod:`fastpipe.experiments._script_fix`), every rung's step the script's."""
        assert self.handoff is not None and self.device is not None and self.fix_hooks is not None
        progress_runner, script_fixes = self.fix_hooks.progress_runner, self.fix_hooks.script_fixes

        def window(w: Workload, device: Any, **kwargs: Any) -> WindowRunner:
            return WindowRunner(w, device, handoff=self.handoff, lines=None, **kwargs)

        self.echo("fastpipe fix: building the candidate fixes from the script's loader, each input checked")
        return script_fixes(
            workload,
            ScriptDevice(self.device),
            self._fix_options(),
            runner=progress_runner(window, self.echo if self.options.progress else None),
            script=self.script,
            named=named,
        )

    def _runner(self, *args: Any, **kwargs: Any) -> WindowRunner:
        """The engine's point runner (kept: the notes read its plan and runs), with its progress lines."""
        assert self.handoff is not None
        o = self.options
        lines = LadderProgress(self.echo, self.estimate, o.precision) if o.progress and self.estimate is not None else None
        self.runner = WindowRunner(*args, handoff=self.handoff, lines=lines, **kwargs)
        return self.runner

    def _serve(self) -> tuple[bool, Any]:
        """The ladder's batch for the script's ``next()``: ``(True, batch)``; ``(False, None)`` once the ladder has ended and
        its report is shown, with ``--then-continue`` (else the script is stopped here)."""
        assert self.handoff is not None
        self.epoch_ended = False
        try:
            ok, batch = self.handoff.request()
        except KeyboardInterrupt:
            self.conclude("was interrupted (Ctrl-C)")
            self.code = EXIT_INTERRUPTED
            raise StopScript(EXIT_INTERRUPTED) from None
        if ok:
            if self.loop is not None:
                self.loop.arrived()
            return True, batch
        self.conclude(None)
        if not self.options.then_continue:
            self._release_held()
            self.code = 0 if self.error is None else 1
            raise StopScript(self.code)
        return False, None

    def _put_back(self, why: str, *more: Any) -> None:
        """Put the script's state back in place as it was when the ladder took over (model, optimizers, schedulers,
        scalers, RNGs, the loader's generators), once for each ``(why, *more)`` until the ladder or an optimizer takes
        a step (a ``state_dict`` read meets the hook of every submodule). Only from the script's thread while the
        engine waits on its step (never at once with the engine's own restores), or once the engine is done."""
        trained = self.guard.optimizer_steps if self.guard is not None else None
        key = (why, self.handoff.steps if self.handoff is not None else None, trained, *more)
        if key == self.put_back_for:
            return
        for state in self.saved:
            state.restore()
        self.put_back_for = key

    def _epoch_work(self) -> None:
        """The script's own work after an epoch ended during the ladder (it iterates another loader or reads its state):
        what it sees and saves is its own state."""
        if self.state == "ladder" and self.epoch_ended:
            self._put_back("epoch work")

    def _state_read(self, exc: BaseException | None) -> None:
        """The script reads its state (``state_dict``, :class:`~fastpipe.diagnosis._exitguard.ExitGuard`): on its way out
        (``exc`` in flight: a crash, ``sys.exit``, Ctrl-C) or at an epoch's end during the ladder, put it back first."""
        if self.state != "ladder":
            return
        if exc is not None:
            self._put_back("exit", id(exc))
        else:
            self._epoch_work()

    def _interrupted(self) -> None:
        """A Ctrl-C landed in the script's own step: put its state back before Python raises KeyboardInterrupt there."""
        if self.state == "ladder":
            self._put_back("ctrl-c")

    def _close_guard(self) -> None:
        guard, self.guard = self.guard, None
        if guard is not None:
            guard.close()

    def close_loop(self) -> None:
        """Remove the loop timer's hooks from the script's models (once), keeping what it timed."""
        loop, self.loop = self.loop, None
        if loop is not None:
            self.loop_work = loop.close()

    def _release_held(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            shutdown_iterator(held)

    # ----- the outcome -----------------------------------------------------------------------
    def conclude(self, why: str | None) -> None:
        """Wait for the engine (telling it the script is gone when ``why`` says how), then print the report or error."""
        if self.state != "ladder" or self.handoff is None:
            return
        if why is not None:
            self.handoff.gone(f"the script {why}")
        try:
            outcome = self._wait_for_engine()
        finally:
            self.state = "after"
            self.close_loop()
            self._close_guard()
        if outcome is None:
            self._put_back("engine still running")  # the script's state from the snapshot taken at the handover
            return
        self.report, self.error = outcome
        if self.nudged:
            self._put_back("engine stopped")  # the engine's own restore may be what EngineStopped cut short
        for sampler, epoch in self.epochs:
            sampler.epoch = epoch
        if self.thread is not None:
            self.thread.join(ENGINE_EXIT_WAIT_S)
        if self.report is not None and self.options.fix == "only":
            if why is not None:
                self.report.notes.append(f"the script {why} while the fixes were measured, so this report is partial")
            self.show(self.report)
        elif self.report is not None and self.report.experiments:
            self._annotate(self.report, why)
            self.show(self.report)
            if isinstance(self.fix_report, BaseException):
                self.echo(f"fastpipe diagnose --fix: the fixes were not measured: {type(self.fix_report).__name__}: {self.fix_report}")
            elif self.fix_report is not None:
                self.show(self.fix_report)
        elif self.report is not None:
            self.echo(
                f"fastpipe diagnose: the script {why or 'stopped'} before the ladder measured its first point "
                f"({self.handoff.steps} steps in): no report"
            )
        elif self.error is not None:
            self._explain(self.error)

    def _wait_for_engine(self) -> tuple[Any, BaseException | None] | None:
        """The engine's ``(report, error)``; None when it did not finish in ``ENGINE_EXIT_WAIT_S`` or a second Ctrl-C
        asked to leave without it (both said on stderr)."""
        assert self.handoff is not None
        try:
            outcome = self.handoff.wait_outcome(ENGINE_NUDGE_S)
            if outcome is None and self.handoff.is_gone and self.thread is not None:
                # a pass that takes no step of the script (the loader's memory pass) has not seen it go: stop it there
                self.nudged = _raise_in(self.thread, EngineStopped)
                outcome = self.handoff.wait_outcome(ENGINE_SLOW_S)
            if outcome is None:
                self.echo(
                    "fastpipe diagnose: waiting for the ladder to stop its workers and write its report "
                    f"(at most {ENGINE_EXIT_WAIT_S:.0f} s; Ctrl-C leaves without it)"
                )
                outcome = self.handoff.wait_outcome(ENGINE_EXIT_WAIT_S - ENGINE_SLOW_S - ENGINE_NUDGE_S)
        except KeyboardInterrupt:
            self.echo("fastpipe diagnose: left without the ladder's report (Ctrl-C while it stopped)")
            return None
        if outcome is None:
            self.echo(f"fastpipe diagnose: the ladder did not finish within {ENGINE_EXIT_WAIT_S:.0f} s of the script's end; no report")
        return outcome

    def _annotate(self, report: Report, why: str | None) -> None:
        assert self.handoff is not None and self.trained is not None
        h, seen = self.handoff, self.trained
        took = f"{h.steps} steps of its loop" + (
            f" ({h.spoiled} dropped: they spanned other work of the script, a new epoch or another loader)" if h.spoiled else ""
        )
        before = self.before
        real = (
            f"; before it, the script's real loop ran {1000 * before.elapsed_s / before.steps:.1f} ms/step over {before.steps} steps, "
            f"{before.share:.0%} of it waiting for batches (the first batch, worker start-up, included)"
            if before is not None and before.steps
            else ""
        )
        report.notes.insert(
            0,
            f"script mode: the ladder ran inside {self.script}'s own loop on {seen.label} and took {took}: each point's "
            f"step time is the time between the loop's next() calls, the script's own step included{real}",
        )
        if self.found is not None and (h.steps and self.found.modules):
            report.notes.append(
                f"put back after the ladder: {self.found.describe()}, the RNGs and the loader's generators; the script's own "
                "counters (its step number, a framework's global step) counted the ladder's steps"
            )
        if self.epoch_ends:
            report.notes.append(
                f"the script's epochs were kept: {self.epoch_ends} of {seen.label}'s epochs ended during the ladder, each after "
                "len(loader) batches as the real loader's would; the steps across each epoch's end were left out, and the "
                "script's state was put back before its end-of-epoch work (validation, checkpoints), so what it saved there "
                "is its own"
            )
        if self.device is not None and self.device.kind == "cpu":
            report.caveats.insert(0, CPU_STEP_CAVEAT)
        add_loop_work(report, self.loop_work)
        runs = self.runner.runs if self.runner is not None else {}
        if self.estimate is not None:
            e, again = self.estimate, sum(len(r) > 1 for r in runs.values())
            report.notes.append(
                f"the ladder took {duration(time.perf_counter() - self.started_at)} from its first step to its report, with "
                f"{len(runs)} point{'s' if len(runs) != 1 else ''} measured and {again} measured again; the announcement "
                f"estimated {e.summary()}"
            )
        if isinstance(self.error, StepBudgetSpent) or h.spent:
            report.interrupted = False  # a budget stop, not an interruption: what was measured is complete as far as it goes
            measured = {x.cache_point for x in report.experiments}
            missing = [point_label(p) for p in (self.runner.plan.points if self.runner else []) if p not in measured]
            report.notes.append(
                f"the ladder stopped at its budget of {self.options.budget_steps} steps of the script's loop"
                + (f" before it measured {', '.join(missing)}" if missing else "")
                + f" (--budget-steps); without that cap each point has its --budget of {self.options.budget_s:g} s"
            )
        elif why is not None:
            report.notes.append(f"the script {why} during the ladder and asked for no more batches, so this report is partial")

    def _explain(self, error: BaseException) -> None:
        if self.options.fix == "only" and isinstance(error, (ScriptGone, KeyboardInterrupt)):
            steps = self.handoff.steps if self.handoff is not None else 0
            self.echo(
                f"fastpipe fix: the fixes were not all measured ({steps} steps of the script's loop in): {error}. Every fix "
                "and the original are measured in one run, so there is no partial report: give the script more epochs "
                "(or steps), or each rung less time (--budget)"
            )
        elif isinstance(error, FastpipeError):
            self.echo(f"fastpipe diagnose: the ladder stopped: {error}")
        elif isinstance(error, (ScriptGone, KeyboardInterrupt)):
            self.echo(f"fastpipe diagnose: the ladder stopped before measuring a point: {error}")
        else:
            self.echo(
                "fastpipe diagnose: the ladder failed (a fastpipe error; please report it):\n" + "".join(traceback.format_exception(error))
            )

    def nothing_measured(self) -> str | None:
        """Why the ladder never started, once the script has ended (None when it did start)."""
        if self.trained is not None:
            return None
        o = self.options
        if not self.seen:
            found = no_loader_text(self.sampler.loop_calls() if self.sampler is not None else [])
            if found:
                return (
                    f"fastpipe diagnose: {self.script} ended without iterating a DataLoader, so there was no loader to run the "
                    f"ladder in;\n{found}\n  then: fastpipe diagnose -- python {self.script} ..."
                )
            return (
                f"fastpipe diagnose: {self.script} ended without iterating a DataLoader, so there was no loop to run the ladder in. "
                "If it reads batches some other way (a generator, a get_batch function), iterate a DataLoader over a dataset that "
                "declares its stages, fastpipe.stages.Stages(source=..., transforms=[...]) (see help(fastpipe.stages.Stages)), then run "
                f"fastpipe diagnose -- python {self.script} again"
            )
        counts = ", ".join(f"{s.label}: {s.most} batches" for s in self.seen.values())
        which = f"DataLoader #{o.loader}" if o.loader else "any of its DataLoaders"
        waited = [s for s in self.seen.values() if s.choice is not None and not s.choice.chosen and not o.loader]
        if waited:
            s = waited[0]
            lengths = ", ".join(str(epoch_length(x)) for x in s.choice.longer)  # type: ignore[union-attr]
            return (
                f"fastpipe diagnose: {self.script} ended before its training loader delivered {o.start_after} batches: "
                f"{s.label} ({epoch_length(s.loader)} batches an epoch) was passed over for a longer DataLoader it holds "
                f"({lengths} batches an epoch), which it never iterated that far ({counts}). If {s.label} is the one it "
                f"trains on, pick it: --loader {s.index}"
            )
        return (
            f"fastpipe diagnose: {self.script} ended before {which} delivered {o.start_after} batches in one epoch ({counts}), "
            "so the ladder never started: run it with enough data for a few more steps"
            + (f", or pick the training loader with --loader (it iterated {len(self.seen)})" if o.loader else "")
        )


def _raise_in(thread: threading.Thread, kind: type[BaseException]) -> bool:
    """Raise ``kind`` in ``thread`` at its next bytecode, as a Ctrl-C raises KeyboardInterrupt in the main thread of a
    factory run (the engine's passes handle it so); a call blocked in C (a queue's get) sees it when it returns."""
    import ctypes

    if thread.ident is None or not thread.is_alive():
        return False
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(kind))
    if done > 1:  # never expected: undo rather than hit other threads
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), None)
    return done == 1


def _block_interrupts() -> None:
    """Block SIGINT in the engine's thread, so every process it starts (each cache point's DataLoader workers, forked or
    spawned: both keep the starting thread's signal mask) ignores a Ctrl-C sent to the process group.

    Why: a terminal's Ctrl-C reaches every process of the group. A cache point's worker that it interrupts dies mid-batch
    or hangs in its exit (its queue's feeder flushing to a pipe nobody reads), and the engine's ``next()`` on that point
    then waits for it for good: the partial report never came, and the workers killed at exit left their
    ``pymp-*/listener-*`` folders in the temp folder. The engine stops its workers itself once the script is gone;
    the script's own loader keeps the terminal's behaviour. The signal still reaches the script's thread, where Python
    runs its handler.
    """
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _share_temp_dir() -> None:
    """Make this process's multiprocessing temp folder (``pymp-*``) now, so every DataLoader worker forked later puts
    its ``listener-*`` socket in it, and this process removes it, with whatever is left in it, when it exits.

    Why: a worker passes each batch's shared memory by file descriptor, through a listener in a ``pymp-*`` folder of
    its own, made the first time it sends one. A worker stopped just as it hands over a batch (a cache point's
    loader closed mid-stream, most often on Ctrl-C) can make that folder in its queue's feeder thread while it is
    already running its exit finalizers: the folder's removal is registered too late to run, and the folder stays
    in the temp folder. A forked worker uses its parent's folder when there is one and never removes it.
    """
    import multiprocessing.util

    multiprocessing.util.get_temp_dir()


def run_script(kind: str, target: str, args: list[str], session: ScriptLadder) -> int:
    """Run the script as ``python`` would, in this process, under ``session``; its exit code (or fastpipe's)."""
    session.options.check()
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [target, *args]
    sys.path.insert(0, str(Path(target).resolve().parent) if kind == "path" else os.getcwd())
    _share_temp_dir()
    code: int = 0
    exited = False  # the script left by SystemExit (its --help, an argument error, sys.exit)
    session.sampler = LoopSampler(target)
    try:
        with session.sampler, tap_dataloaders(session.select, session.source):
            try:
                if kind == "path":
                    runpy.run_path(target, run_name="__main__")
                else:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
            except StopScript as stop:
                code = stop.code if isinstance(stop.code, int) else 0
            except SystemExit as exc:
                session.conclude(f"exited (SystemExit {exc.code!r})")
                code = _exit_code(exc)
                exited = True
            except KeyboardInterrupt:
                session.conclude("was interrupted (Ctrl-C)")
                code = EXIT_INTERRUPTED
            except BaseException as exc:
                session.conclude(f"raised {type(exc).__name__}: {exc}")
                sys.stdout.flush()
                traceback.print_exception(type(exc), exc, _script_frames(exc.__traceback__), file=sys.stderr)
                code = 1
            else:
                session.conclude("ended")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        session.conclude("ended")
        session.close_loop()
        session._release_held()
    if session.code is not None:
        return session.code
    if exited and not session.seen and not (session.sampler is not None and session.sampler.loop_calls()):
        return code  # it left by itself before any loop (its --help, a bad argument): python's exit, no advice
    missing = session.nothing_measured()
    if missing is not None:
        if session.options.fix == "only":
            missing = missing.replace("fastpipe diagnose", "fastpipe fix").replace("the ladder never started", "no fix was measured")
        session.echo(missing)
        return code or EXIT_NOTHING
    return code


def _exit_code(exc: SystemExit) -> int:
    """What ``python`` exits with for ``sys.exit(code)``: a message is printed to stderr and exits 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr, flush=True)
    return 1


def _script_frames(tb: Any) -> Any:
    """The traceback from the script's first frame on (runpy's and fastpipe's frames above it dropped)."""
    ours = (str(Path(__file__).resolve().parents[1]), str(Path(runpy.__file__)), "<frozen runpy>")
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(ours):
        first = first.tb_next
    return first or tb
