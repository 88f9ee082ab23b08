"""Script mode's parts that need no script: the handoff between the ladder's thread and the loop, and what a running
script trains, found among the live objects."""

from __future__ import annotations

import threading
import time
import weakref

import pytest
import torch

from fastpipe.diagnosis._handoff import Handoff, ScriptGone, StepBudgetSpent
from fastpipe.diagnosis._trainstate import find_training_state


def _loop(handoff: Handoff, taken: list, step_s: float, other_work_at: int | None = None) -> None:
    """The script's side: ask for batches until the engine finishes, 'training' ``step_s`` on each."""
    while True:
        ok, batch = handoff.request()
        if not ok:
            return
        taken.append(batch)
        if other_work_at is not None and batch == other_work_at:
            handoff.elsewhere()  # e.g. iter(val_loader) between two steps
        time.sleep(step_s)


def test_each_step_returns_when_the_loop_asks_again() -> None:
    handoff, taken = Handoff(budget_steps=100), []
    script = threading.Thread(target=_loop, args=(handoff, taken, 0.02))
    script.start()
    durations, spoiled = [], []
    for i in range(5):
        start = time.perf_counter()
        handoff.step(i)
        durations.append(time.perf_counter() - start)
        spoiled.append(handoff.last_spoiled)
    handoff.finish("report")
    script.join(5)
    assert taken == [0, 1, 2, 3, 4] and not script.is_alive()
    assert min(durations) >= 0.02  # the engine's step lasts the script's own step
    assert handoff.wait_outcome(0) == ("report", None) and handoff.steps == 5 and not any(spoiled)


def test_a_step_that_spans_other_work_is_flagged() -> None:
    handoff, taken = Handoff(budget_steps=100), []
    script = threading.Thread(target=_loop, args=(handoff, taken, 0.0, 2))
    script.start()
    flags = []
    for i in range(4):
        handoff.step(i)
        flags.append(handoff.last_spoiled)
    handoff.finish(None)
    script.join(5)
    assert flags == [False, False, True, False] and handoff.spoiled == 1


def test_the_script_is_busy_only_in_its_own_step() -> None:
    # a Ctrl-C that lands while the script is busy (the engine waits on it) may put its state back right there
    handoff, seen = Handoff(budget_steps=100), []
    in_step, resume = threading.Event(), threading.Event()

    def loop() -> None:
        seen.append(handoff.script_busy())  # before its first batch
        handoff.request()
        in_step.set()
        resume.wait(5)
        handoff.request()  # waits for the engine's next batch: not busy

    script = threading.Thread(target=loop)
    engine = threading.Thread(target=handoff.step, args=("batch",))
    script.start()
    engine.start()
    assert in_step.wait(5)
    seen.append(handoff.script_busy())  # in its step, the engine waiting on it
    resume.set()
    engine.join(5)  # the step returned: the script asked again
    seen.append(handoff.script_busy())
    handoff.gone("the script ended")
    handoff.finish(None)
    script.join(5)
    assert seen == [False, True, False] and handoff.is_gone and not script.is_alive()


def test_the_budget_and_a_gone_script_stop_the_engine() -> None:
    handoff, taken = Handoff(budget_steps=2), []
    script = threading.Thread(target=_loop, args=(handoff, taken, 0.0))
    script.start()
    handoff.step(0)
    handoff.step(1)
    with pytest.raises(StepBudgetSpent):
        handoff.step(2)
    handoff.finish(None)
    script.join(5)
    assert taken == [0, 1]

    handoff = Handoff(budget_steps=10)
    waiting = threading.Thread(target=handoff.request)
    waiting.start()
    threading.Timer(0.05, handoff.gone, args=("the script ended",)).start()
    with pytest.raises(ScriptGone, match="the script ended"):
        handoff.step(0)  # taken, but the script never asks again
    waiting.join(5)
    with pytest.raises(KeyboardInterrupt):  # the engine stops as on Ctrl-C: a partial report
        handoff.step(1)


class _Wrapper(torch.optim.Optimizer):
    """Forwards to another optimizer, as accelerate's AcceleratedOptimizer does."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer


def test_training_state_is_the_root_modules_and_real_optimizers() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    ema = torch.nn.Linear(3, 2)
    stateless = torch.nn.ReLU()  # holds nothing to restore
    proxy = weakref.proxy(model)  # passes isinstance(nn.Module), is no module of its own
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = _Wrapper(optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    found = find_training_state()
    assert any(m is model for m in found.modules) and any(m is ema for m in found.modules)
    assert not any(m is model[0] for m in found.modules) and not any(m is stateless for m in found.modules)
    assert not any(type(m).__name__ == "ProxyType" for m in found.modules)
    assert any(o is optimizer for o in found.optimizers) and not any(o is wrapped for o in found.optimizers)
    assert any(s is scheduler for s in found.schedulers)
    assert found.device() == torch.device("cpu")
    del proxy
