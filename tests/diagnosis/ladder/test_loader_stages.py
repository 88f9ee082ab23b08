"""A self-timing loader's stage costs (fastpipe.diagnosis.ladder._loader_stages): the timed window, its figures and its advice.

A fake loader's clocks advance by known amounts and a fake clock gives the wall time, so every figure is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastpipe.diagnosis.ladder import _loader_stages
from fastpipe.diagnosis.ladder._loader_stages import SCHEMA, LoaderStageCosts, StageWindow
from fastpipe.diagnosis.verdict._advice import recommend_loader_stage
from fastpipe.loading import TimesOwnStages

STAGES = (("read", "reading thread"), ("decode", "decoding thread"), ("wait", "loop thread"))


class FakeLoader:
    """Clocks that the test moves by hand: seconds and images per stage, batches delivered."""

    def __init__(self, threads: int = 2) -> None:
        self.totals = {name: [0.0, 0, 0, 0] for name, _ in STAGES}  # seconds, items, calls, threads
        self.images = self.batches = 0
        self.threads = threads

    def work(self, batches: int, read_s: float, decode_s: float, wait_s: float, batch: int = 4) -> None:
        for name, seconds in (("read", read_s), ("decode", decode_s), ("wait", wait_s)):
            total = self.totals[name]
            total[0] += seconds * batches
            total[1] += batch * batches
            total[2] += batches
            total[3] += batches * (self.threads if name == "decode" else 1)
        self.images += batch * batches
        self.batches += batches

    def stage_clocks(self) -> dict:
        return {
            "stages": [
                {"stage": name, "thread": thread, "what": f"{name}ing", "seconds": t[0], "items": t[1], "calls": t[2], "threads": t[3]}
                for (name, thread), t in zip(STAGES, self.totals.values())
            ],
            "images": self.images,
            "batches": self.batches,
        }


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A fake ``time.perf_counter`` for the window (now[0] is the time)."""
    now = [100.0]

    class FakeTime:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

    monkeypatch.setattr(_loader_stages, "time", FakeTime)
    return now


def run(loader: FakeLoader, clock: list[float], warmup: int, steps: int, step_s: float = 0.02) -> StageWindow:
    """What measure_until does with on_step: ``warmup`` untimed steps (slow ones), then ``steps`` timed ones."""
    window = StageWindow(loader, warmup)
    window.begin()
    for i in range(warmup + steps):
        if i < warmup:
            loader.work(1, read_s=1.0, decode_s=5.0, wait_s=3.0)  # warm-up: start-up costs that must not count
            clock[0] += 9.0
        else:
            loader.work(1, read_s=0.002, decode_s=0.012, wait_s=0.008)
            clock[0] += step_s
        window.on_step(i)
    return window


def test_the_window_leaves_the_warmup_out(clock: list[float]) -> None:
    loader = FakeLoader(threads=2)
    assert isinstance(loader, TimesOwnStages)
    window = run(loader, clock, warmup=2, steps=5).finish()
    assert window.loader is None and window.loader_name == "FakeLoader", "a finished window holds no loader (nor its buffers)"
    loader.work(4, read_s=1.0, decode_s=1.0, wait_s=1.0)  # after the run: not counted
    costs = LoaderStageCosts.from_windows("FakeLoader", [window])
    assert costs is not None
    assert (costs.steps, costs.images, costs.batches) == (5, 20, 5)
    assert costs.step_ms == pytest.approx(20.0)
    decode = costs.stage("decode")
    assert decode.ms_per_image == pytest.approx(3.0)  # 12 ms per batch of 4
    assert decode.ms_per_step == pytest.approx(12.0)
    assert decode.share_of_step == pytest.approx(0.6)
    assert decode.threads == pytest.approx(2.0)
    assert costs.stage("read").ms_per_step == pytest.approx(2.0)
    shares = sum(s.share_of_step for s in costs.stages)
    assert shares == pytest.approx(0.1 + 0.6 + 0.4)  # 110%: overlapping threads, not scaled to 100%


def test_without_warmup_the_window_starts_before_the_first_step(clock: list[float]) -> None:
    loader = FakeLoader()
    loader.work(3, read_s=1.0, decode_s=1.0, wait_s=1.0)  # before the run: another point's use of the loader
    costs = LoaderStageCosts.from_windows("FakeLoader", [run(loader, clock, warmup=0, steps=4)])
    assert costs is not None and costs.steps == 4 and costs.stage("decode").ms_per_step == pytest.approx(12.0)


def test_remeasured_runs_are_pooled_and_an_unfinished_one_is_left_out(clock: list[float]) -> None:
    first = run(FakeLoader(), clock, warmup=1, steps=3, step_s=0.02)
    second = run(FakeLoader(), clock, warmup=1, steps=1, step_s=0.06)
    unfinished = run(FakeLoader(), clock, warmup=3, steps=0)
    costs = LoaderStageCosts.from_windows("FakeLoader", [first, second, unfinished])
    assert costs is not None and costs.steps == 4
    assert costs.step_ms == pytest.approx((3 * 20 + 60) / 4)
    assert costs.stage("decode").share_of_step == pytest.approx(4 * 0.012 / 0.12)
    assert LoaderStageCosts.from_windows("FakeLoader", [unfinished]) is None


def test_renderings_name_each_thread_and_say_the_shares_overlap(clock: list[float]) -> None:
    costs = LoaderStageCosts.from_windows("FakeLoader", [run(FakeLoader(threads=3), clock, warmup=1, steps=2)])
    assert costs is not None
    text = "\n".join(costs.lines())
    assert "decoding thread (3 native threads)" in text and "reading thread" in text and "loop thread" in text
    assert "do not add up to 100%" in text and "up to 3x that" in text
    data = json.loads(json.dumps(costs.to_dict()))
    assert data["schema"] == SCHEMA and [s["stage"] for s in data["stages"]] == ["read", "decode", "wait"]
    assert data["stages"][1]["ms_per_image"] == pytest.approx(3.0)
    markdown = costs.markdown_lines()
    assert markdown[2].startswith("| stage | whose time |") and len([m for m in markdown if m.startswith("| ")]) == 4


def costs_with(read_ms: float, decode_ms: float, wait_ms: float, threads: float) -> LoaderStageCosts:
    stages = [
        _loader_stages.LoaderStageCost(name, thread, name, ms / 4, ms, ms / 20, threads if name == "decode" else 1.0, 40, 10)
        for (name, thread), ms in zip(STAGES, (read_ms, decode_ms, wait_ms))
    ]
    return LoaderStageCosts("ThreadLoader", 10, 20.0, 40, 10, stages)


def test_advice_names_the_dominant_stage_never_the_wait() -> None:
    decode = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=1), None, cores=4, threads=1, batch_size=32)
    assert decode is not None and "decode dominates" in decode.summary and "threads=4 (now 1; 4 cores here" in decode.summary
    covered = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=4), None, cores=4, threads=4, batch_size=32)
    assert covered is not None and "threads=4 it already has the 4 cores" in covered.summary
    read = recommend_loader_stage(costs_with(15.0, 12.0, 30.0, threads=2), None, cores=4)
    assert read is not None and "read dominates" in read.summary and "storage" in read.summary


def test_more_threads_are_advised_only_where_they_can_help() -> None:
    """The op starts at most one native thread per image, and two decoding threads decode two batches at once: with
    batches of 4 on 16 cores, threads=8 is all they can use, so no more are advised, and the advice says the batch is
    the limit; threads=4 there is advised up to 8; nor are more advised on saturated cores."""
    few_images = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=8), None, cores=16, threads=8, batch_size=4)
    assert few_images is not None and "more threads will not help" in few_images.summary
    assert "Give it more native threads" not in few_images.summary
    assert "batches of 4 images can use" in few_images.summary and "larger batch_size" in few_images.summary
    assert "already has the 16 cores" not in few_images.summary, "the batch is the limit, not the cores"
    fewer = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=4), None, cores=16, threads=4, batch_size=4)
    assert fewer is not None and "Give it more native threads: threads=8 (now 4" in fewer.summary
    busy = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=1), None, cores=4, threads=1, batch_size=32, saturated=True)
    assert busy is not None and "cores were saturated" in busy.summary and "Give it more" not in busy.summary


def test_not_input_bound_the_table_says_its_figures_cost_no_step() -> None:
    costs = costs_with(2.0, 12.0, 30.0, threads=1)
    assert not any("not input-bound" in line for line in costs.lines())
    costs.input_bound = False
    assert any("not input-bound" in line and "costs training time" in line for line in costs.lines())


def test_hand_over_in_a_span_is_not_advised_as_a_transform() -> None:
    from fastpipe.diagnosis.ladder._plan import SPAN, kind_of
    from fastpipe.diagnosis.verdict._advice import recommend

    span = "raw load + transforms + hand-over"
    assert kind_of([span]) == SPAN
    text = recommend(span, SPAN).summary
    assert "hand-over: the ThreadLoader giving decoded batches" in text and "custom transform" not in text.split("hand-over:")[1]


def test_decode_advice_counts_progressive_files(tmp_path: Path) -> None:
    from PIL import Image

    files = []
    for k, progressive in enumerate((True, False, False)):
        path = tmp_path / f"{k}.jpg"
        Image.new("RGB", (32, 24), (k * 60, 90, 30)).save(path, progressive=progressive)
        files.append((str(path), 0))

    class Folder:
        samples = files

    advice = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=1), Folder(), cores=4)
    assert advice is not None and "1 of 3 files probed are progressive" in advice.summary and "fastpipe prepare" in advice.summary
    Folder.samples = files[1:]
    advice = recommend_loader_stage(costs_with(2.0, 12.0, 30.0, threads=1), Folder(), cores=4)
    assert advice is not None and "would not make them faster" in advice.summary
