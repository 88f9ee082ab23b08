"""Snapshots of the user's training state (fastpipe.diagnosis.runtime._snapshot): in host memory, and complete."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fastpipe.diagnosis.runtime._snapshot import UserState, preserve_user_state


def train(model, optimizer, scheduler=None, scaler=None, steps: int = 3) -> None:
    model.train()
    for _ in range(steps):
        loss = model(torch.randn(4, 6)).square().mean()
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if scheduler is not None:
            scheduler.step()


def small_model(device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2)).to(device)


def test_model_optimizer_scheduler_and_scaler_are_restored() -> None:
    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    train(model, optimizer, scheduler, scaler, steps=2)  # some state to keep
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    lr, epoch, scale = optimizer.param_groups[0]["lr"], scheduler.last_epoch, scaler.get_scale()
    rngs = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())

    with preserve_user_state(model, optimizer, schedulers=scheduler, scaler=scaler):
        train(model, optimizer, scheduler, scaler, steps=3)
        np.random.rand(), random.random()
        assert scheduler.last_epoch == epoch + 3 and optimizer.param_groups[0]["lr"] != lr and scaler.get_scale() != scale

    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters())) and not model.training
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, optimizer.state.values()))
    assert optimizer.param_groups[0]["lr"] == lr and scheduler.last_epoch == epoch and scaler.get_scale() == scale
    assert torch.equal(torch.get_rng_state(), rngs[0]) and np.array_equal(np.random.get_state()[1], rngs[1])
    assert random.getstate() == rngs[2]


def test_several_schedulers() -> None:
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=4)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    with preserve_user_state(model, optimizer, schedulers=[warmup, plateau]):
        train(model, optimizer, warmup)
        for loss in (1.0, 2.0, 3.0):
            plateau.step(loss)
    assert warmup.last_epoch == 0 and plateau.num_bad_epochs == 0 and plateau.best == float("inf")


def test_snapshot_is_a_copy_in_host_memory() -> None:
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters())
    train(model, optimizer)
    state = UserState(model, optimizer)
    held = state.tensors()
    params = {t.data_ptr() for t in model.state_dict().values()} | {t.data_ptr() for s in optimizer.state.values() for t in s.values()}
    assert len(held) >= 2 * len(list(model.parameters())) and all(t.device.type == "cpu" for t in held)
    assert not {t.data_ptr() for t in held if t.numel()} & params  # copies, not views of the live tensors


def test_meta_model_holds_nothing_and_restores() -> None:
    model = torch.nn.Linear(4, 4, device="meta")
    with preserve_user_state(model) as state:
        model.train(False)
    assert all(t.is_meta for t in state.tensors()) and model.training


@pytest.mark.gpu
def test_cuda_snapshot_stays_off_the_device() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()  # 32 MiB of weights
    optimizer = torch.optim.Adam(model.parameters())
    loss = model(torch.randn(8, 1024, device="cuda")).square().mean()
    loss.backward()
    optimizer.step()  # 64 MiB of moments
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with preserve_user_state(model, optimizer) as state:
        during = torch.cuda.memory_allocated()
        optimizer.step()
    assert all(t.device.type == "cpu" for t in state.tensors())
    assert during - before < 1 << 20  # no device copy of ~100 MiB of state
    assert all(s["exp_avg"].is_cuda for s in optimizer.state.values()) and next(model.parameters()).grad.is_cuda
