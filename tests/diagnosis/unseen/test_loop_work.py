"""The loop's own work on each batch before its model (fastpipe.diagnosis.unseen._loop_work): timed from the batch's
arrival to the model's first forward on the loop's thread, with hooks that leave the model as it was."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

from fastpipe.diagnosis.unseen._loop_work import LoopTimer
from fastpipe.diagnosis.unseen._main_process import LOOP_WORK, MainProcess
from fastpipe.diagnosis.verdict._main_process import add_loop_work
from fastpipe.diagnosis.verdict._report import Report


def burn(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


def report(device_step_ms: float) -> Report:
    r = Report(workload="w", device="cpu", num_workers=2, batch_size=8, steps=4, warmup=1, pool=1, threshold=0.05, strategy="linear")
    r.device_step_ms = r.baseline_step_ms = device_step_ms
    r.main_process = MainProcess(workers=2, batch_size=8)
    return r


def test_the_work_between_the_batch_and_the_first_forward_is_timed_and_the_hooks_leave_the_model_as_it_was() -> None:
    model = nn.Linear(4, 2)
    mine = model.register_forward_pre_hook(lambda module, args: None)  # the user's own hook stays
    before = dict(model._forward_pre_hooks)
    timer = LoopTimer([model], None)
    x = torch.zeros(3, 4)
    for _ in range(5):
        timer.arrived()
        burn(6)
        model(x)
        model(x)  # a second forward in the step (a loss on two views): the step was timed at the first
    timer.arrived()
    timer.elsewhere()  # another loader began before the model ran: not timed
    model(x)
    timer.arrived()
    thread = threading.Thread(target=lambda: model(x))  # a forward on another thread is no loop's
    thread.start()
    thread.join()
    work = timer.close()
    assert dict(model._forward_pre_hooks) == before and mine.id in model._forward_pre_hooks
    assert work.steps == 5 and 6 <= work.ms_per_step < 30 and work.cpu_ms >= 5.5 and work.idle_steps is None
    timer.arrived()
    model(x)  # after close nothing is timed
    assert timer.close().steps == 5


def test_loop_work_that_costs_the_step_is_named_and_a_light_one_is_listed_only() -> None:
    model = nn.Linear(4, 2)
    heavy = LoopTimer([model], None)
    for _ in range(6):
        heavy.arrived()
        burn(4)
        model(torch.zeros(1, 4))
    named = report(device_step_ms=10.0)
    assert add_loop_work(named, heavy.close())
    (stage,) = named.bottlenecks
    assert stage.stage == LOOP_WORK and stage.kind == "main process" and 4 <= stage.added_ms < 20
    assert "into the dataset's transforms" in stage.recommendation and "onto the device" in stage.recommendation
    assert f"{LOOP_WORK} [main process]: costs" in named.to_table() and "[named: it costs the step]" in named.to_table()
    light = LoopTimer([model], None)
    for _ in range(6):
        light.arrived()
        model(torch.zeros(1, 4))
    listed = report(device_step_ms=10.0)
    assert not add_loop_work(listed, light.close()) and not listed.bottlenecks
    assert listed.main_process.part(LOOP_WORK) is not None and "[named" not in "\n".join(listed.main_process.lines())
