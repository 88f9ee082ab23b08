"""The snapshot's suspected gaps, each confirmed and fixed or shown to hold (issue 33, item 12)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from fastpipe.diagnosis.runtime._snapshot import preserve_user_state


class Counting(torch.nn.Module):
    """A model with a persistent buffer and a non-persistent one, both moved by a step (as EMA or step counters are)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.register_buffer("seen", torch.zeros(1))
        self.register_buffer("calls", torch.zeros(1), persistent=False)
        self.inner = torch.nn.Module()
        self.inner.register_buffer("cache", torch.ones(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        self.calls += 1  # in place
        self.inner.cache = self.inner.cache * 2  # assigned: a new tensor
        return self.layer(x)


def test_non_persistent_buffers_are_restored() -> None:
    """Confirmed: state_dict leaves non-persistent buffers out, so the snapshot did not restore them."""
    model = Counting()
    calls, cache = model.calls, model.inner.cache
    with preserve_user_state(model):
        model(torch.ones(1, 2))
        model(torch.ones(1, 2))
    assert model.seen.item() == 0 and model.calls.item() == 0
    assert model.inner.cache.tolist() == [1.0, 1.0, 1.0]
    assert model.calls is calls and model.inner.cache is cache, "the user's own tensors, not copies"
    assert "calls" not in model.state_dict() and "inner.cache" not in model.state_dict()


def test_non_persistent_buffers_are_restored_by_diagnose() -> None:
    import fastpipe

    model = Counting()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
    from fastpipe.diagnosis._options import TrainState
    from tests.fakes import quick_options

    fastpipe.diagnose(loader, lambda batch: model(batch).sum().backward(), device="cpu",
                      train_state=TrainState(model=model, optimizer=optimizer),
                      options=quick_options(steps=2, warmup=1, budget=0.5))  # fmt: skip
    assert model.calls.item() == 0 and model.inner.cache.tolist() == [1.0, 1.0, 1.0]


CUDA_PROBE = textwrap.dedent("""
    import torch
    from fastpipe.diagnosis.runtime._snapshot import UserState
    n = torch.cuda.device_count()
    first = [torch._C._cuda_hasPrimaryContext(i) for i in range(n)] if n else []
    UserState().restore()
    print(torch.cuda.is_initialized(), sum(first), sum(torch._C._cuda_hasPrimaryContext(i) for i in range(n)) if n else 0)
""")


def test_the_snapshot_does_not_initialize_cuda() -> None:
    """Suspected: the snapshot opened CUDA (a context on every visible GPU) in a process that never used it. Its CUDA
    generators are read only where CUDA is already initialized; on a machine without a GPU this holds trivially."""
    out = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "0", "0"], out


@pytest.mark.gpu
def test_the_snapshot_opens_no_context_on_another_gpu_gpu() -> None:
    """With CUDA in use on device 0 only, the snapshot's read of every device's generator opens no other context."""
    probe = textwrap.dedent("""
        import torch
        from fastpipe.diagnosis.runtime._snapshot import UserState
        torch.zeros(1, device="cuda:0")
        before = [torch._C._cuda_hasPrimaryContext(i) for i in range(torch.cuda.device_count())]
        state = UserState()
        torch.rand(3, device="cuda:0")
        state.restore()
        print(before == [torch._C._cuda_hasPrimaryContext(i) for i in range(torch.cuda.device_count())])
    """)
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split() == ["True"]


@pytest.mark.gpu
def test_cuda_first_used_inside_the_block_is_put_back_at_its_seed_gpu() -> None:
    probe = textwrap.dedent("""
        import torch
        from fastpipe.diagnosis.runtime._snapshot import preserve_user_state
        torch.manual_seed(7)
        with preserve_user_state():
            torch.rand(3, device="cuda")
        a = torch.rand(3, device="cuda").tolist()
        torch.cuda.manual_seed(7)
        print(a == torch.rand(3, device="cuda").tolist())
    """)
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split() == ["True"]


FAILING_FACTORY = """
import torch

def helper(n):
    return torch.zeros(n).view(3, 5)

def make():
    data = helper(7)
    return data, None
"""


def test_a_factorys_error_keeps_one_line_and_shows_the_users_frame(tmp_path, monkeypatch, capsys) -> None:
    """Suspected, confirmed: the one-line ConfigError lost where the factory failed (here inside torch, called from the
    user's helper). The line now names the user's deepest frame: file, line, function and source."""
    from fastpipe.cli import main

    (tmp_path / "failing_factory_mod.py").write_text(FAILING_FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["diagnose", "failing_factory_mod:make", "--device", "sim:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "raised RuntimeError" in err
    assert "at failing_factory_mod.py:5 in helper: return torch.zeros(n).view(3, 5)" in err, err
