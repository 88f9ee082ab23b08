"""one_intraop_thread_here: the calling thread gets one intra-op thread; the script's thread and threads started later keep
the process's count (fastpipe.diagnosis.runtime._threads says why it matters to a CPU step's timing)."""

from __future__ import annotations

import threading

import pytest
import torch

from fastpipe.diagnosis.runtime._threads import one_intraop_thread_here, openmp_backend


def _in_thread(work):  # noqa: ANN001, ANN202 - a small runner: work() in a new thread, its result
    out: dict[str, object] = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", work()))
    thread.start()
    thread.join()
    return out["value"]


@pytest.fixture
def two_or_more_threads():  # noqa: ANN201
    before = torch.get_num_threads()
    if not openmp_backend():
        pytest.skip("torch's parallel backend here is not OpenMP")
    if before < 2:
        torch.set_num_threads(2)
    yield torch.get_num_threads()
    torch.set_num_threads(before)


def test_only_the_calling_thread_gets_one_thread(two_or_more_threads: int) -> None:
    count = two_or_more_threads

    def engine() -> tuple[bool, int, int]:
        did = one_intraop_thread_here()
        later = _in_thread(torch.get_num_threads)  # a thread started after it: the process's count
        return did, torch.get_num_threads(), later

    did, engine_count, later_count = _in_thread(engine)
    assert did
    assert engine_count == 1
    assert later_count == count
    assert torch.get_num_threads() == count  # the caller's (the script's) thread kept its own


def test_a_thread_that_already_has_one_is_left_alone(two_or_more_threads: int) -> None:
    def engine() -> tuple[bool, bool]:
        torch.set_num_threads(1)
        try:
            return one_intraop_thread_here(), torch.get_num_threads() == 1
        finally:
            torch.set_num_threads(two_or_more_threads)

    assert _in_thread(engine) == (False, True)


def test_its_ops_give_the_same_results(two_or_more_threads: int) -> None:
    a = torch.randn(300, 400, generator=torch.Generator().manual_seed(0))
    expected = (a @ a.T).sum(dim=1)

    def engine() -> torch.Tensor:
        one_intraop_thread_here()
        return (a @ a.T).sum(dim=1)

    torch.testing.assert_close(_in_thread(engine), expected)
