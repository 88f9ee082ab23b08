"""The second review of the streaming ladder (S1-S8), each reproduced on two small WebDataset shards of 8 samples:
a filter that drops every sample ends the stage-cost pass, a cached batch counts its rows whatever its columns and
wherever the chain batched, ``with_epoch`` takes any integer, a stream's why-not says a buffer only when it sees one,
and a WebDataset chain's raw-load advice says what its shard list allows."""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import IterableDataset, default_collate

import fastpipe.stages
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._serve import probe_point
from fastpipe.diagnosis.ladder._stream import CachePointIterable, TimedStream, epoch_limit
from fastpipe.diagnosis.stagecost._timing import _ledger, _TimedRunner
from tests.fakes import Ticks, served, within

PER_SHARD = 8


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    wds = pytest.importorskip("webdataset")
    from PIL import Image

    out = tmp_path_factory.mktemp("shards")
    shards = [str(out / f"shard-{s}.tar") for s in range(2)]
    for s, url in enumerate(shards):
        with wds.TarWriter(url) as sink:
            for i in range(PER_SHARD):
                data = io.BytesIO()
                Image.new("RGB", (16, 16), (i * 20, s * 50, 0)).save(data, "JPEG")
                sink.write({"__key__": f"s{s}_{i}", "jpg": data.getvalue(), "cls": i})
    return shards


def base(urls: list[str], **kw):
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, **{"empty_check": False, **kw}).decode("torchrgb")


def ident(x):
    return x


def two_views(sample: dict) -> tuple:
    return (sample["jpg"], sample["jpg"].flip(-1)), sample["cls"]


def passthrough(source):
    yield from source


def timed(stream) -> list:
    pipeline, _ = find_pipeline(stream)
    return list(TimedStream(stream, pipeline, _ledger, _TimedRunner))


# ----- S1: an empty pass ends the timed epoch ----------------------------------------------------
def test_a_chain_whose_filter_drops_every_sample_ends_the_timed_pass(urls) -> None:
    stream = base(urls).select(lambda s: False).map(ident).with_epoch(5)
    assert list(stream) == []  # the user's epoch: webdataset stops after a pass that yields nothing
    assert within(20.0, lambda: timed(stream)) == []


def test_the_timed_pass_repeats_whole_passes_with_their_partial_batches(urls) -> None:
    stream = base(urls).batched(3).with_epoch(10)  # 16 samples a pass: batches 3 3 3 3 3 1, then the next pass
    want = [len(batch["jpg"]) for batch in stream]
    got = [len(batch["jpg"]) for batch in within(20.0, lambda: timed(stream))]
    assert want == [3, 3, 3, 3, 3, 1, 3, 3, 3, 3]
    assert got == want


# ----- S2-S4: the samples a cached batch holds ----------------------------------------------------
def test_two_views_collated_by_torch_count_the_batch_not_the_views(urls) -> None:
    stream = base(urls).map(two_views).batched(4, collation_fn=default_collate).map(ident)
    pipeline, _ = find_pipeline(stream)
    cached = CachePointIterable(stream, pipeline, "after:batched", pool=2, clock=Ticks())
    items = served(cached, 2)
    assert len(items[0][0]) == 2 and items[0][0][0].shape[0] == 4  # [[view1 (4..), view2 (4..)], labels]
    assert cached.copy_stats().samples == 8  # 4 a batch, not 2 (the views)


def test_two_views_collated_by_webdataset_count_the_batch_too(urls) -> None:
    from fastpipe.diagnosis.ladder._batches import leading_size

    stream = base(urls).map(two_views).batched(4).map(ident)  # webdataset's collation: views stay a list of 4 pairs
    pipeline, _ = find_pipeline(stream)
    cached = CachePointIterable(stream, pipeline, "after:batched", pool=2, clock=Ticks())
    items = served(cached, 2)
    assert len(items[0][0]) == 4 and items[0][0][0][0].shape[0] == 3  # a view's first dimension is its channels
    assert leading_size(items[0]) == 4  # the stacked labels, a top-level column, before the nested views
    assert cached.copy_stats().samples == 8


def test_a_batch_before_an_unrecognised_step_counts_its_rows(urls) -> None:
    stream = base(urls).batched(4).compose(passthrough).map(ident)
    pipeline, _ = find_pipeline(stream)
    assert pipeline.names() == ["ident"]  # `batched` is before `compose`: part of the "shard read"
    cached = CachePointIterable(stream, pipeline, "after:ident", pool=2, clock=Ticks())
    served(cached, 2)
    assert cached.copy_stats().samples == 8


def test_nested_batches_count_the_rows_of_a_partial_one(urls) -> None:
    stream = base(urls).batched(4).batched(3).map(ident)  # 16 samples: 3 batches of 4 (12), then 1 of 4
    pipeline, _ = find_pipeline(stream)
    cached = CachePointIterable(stream, pipeline, "after:" + pipeline.names()[2], pool=2, clock=Ticks())
    items = served(cached, 2)
    assert [tuple(item["jpg"].shape[:2]) for item in items] == [(3, 4), (1, 4)]
    assert cached.copy_stats().samples == 16  # not 24 (3 x 4 for each)


# ----- S5: with_epoch takes any integer ------------------------------------------------------------
def test_with_epoch_of_a_numpy_integer_limits_the_timed_pass(urls) -> None:
    np = pytest.importorskip("numpy")
    stream = base(urls).map(ident).with_epoch(np.int64(5))
    assert epoch_limit(stream) == 5
    assert len(list(stream)) == 5
    assert len(within(20.0, lambda: timed(stream))) == 5


# ----- S6, S7: a stream's why-not ------------------------------------------------------------------
def decode(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class Filtered(IterableDataset):
    """Drops its first sample after the transform (a quality filter), no buffer at all."""

    def __init__(self) -> None:
        self.stages = fastpipe.stages.Stages(source=[torch.full((3,), float(i)) for i in range(20)], transforms=[decode, scale])

    def __iter__(self):
        for out in self.stages:
            if out[0] != 0:
                yield out


class Raising(Filtered):
    """A prefetch queue of 3 whose second item fails (a corrupt record)."""

    def __iter__(self):
        held = []
        for n, out in enumerate(self.stages):
            held.append(out)
            if len(held) >= 3:
                if n >= 3:
                    raise RuntimeError("corrupt record 4")
                yield held.pop(0)


def test_a_filter_after_the_transform_is_not_called_a_buffer() -> None:
    dataset = Filtered()
    pipeline, _ = find_pipeline(dataset)
    reason = probe_point(dataset, pipeline, "after:decode").reason
    assert reason is not None and "Filtered.__iter__" in reason, reason
    assert "holds the transform's outputs in a buffer" not in reason, reason
    assert "filter that drops items after the transform" in reason, reason


def test_an_error_on_the_item_read_ahead_gives_a_why_not() -> None:
    dataset = Raising()
    pipeline, _ = find_pipeline(dataset)
    reason = probe_point(dataset, pipeline, "after:decode").reason  # the RuntimeError escaped here before
    assert reason is not None and "Raising.__iter__" in reason, reason


# ----- S8: the shard advice ------------------------------------------------------------------------
def shard_advice(stream) -> str:
    from fastpipe.diagnosis.verdict._advice import recommend

    return recommend("raw load", "raw load", transform=[], dataset=stream).text()


def test_shard_advice_says_what_more_workers_than_shards_do(urls) -> None:
    checked = shard_advice(base(urls, empty_check=True))
    assert "at most 2 num_workers" in checked and "empty_check=False" in checked and "raises" in checked, checked
    unchecked = shard_advice(base(urls))
    assert "reads nothing" in unchecked and "raises" not in unchecked, unchecked


def test_shard_advice_counts_shards_per_rank_under_split_by_node(urls, monkeypatch: pytest.MonkeyPatch) -> None:
    import webdataset as wds

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # what webdataset's pytorch_worker_info reads first
    text = shard_advice(base(urls, nodesplitter=wds.split_by_node))
    assert "at most 1 num_workers" in text and "2 ranks" in text, text
    assert "at most 2 num_workers" in shard_advice(base(urls)), "without split_by_node every rank reads every shard"


def test_shard_advice_does_not_ask_a_batching_chain_to_batch(urls) -> None:
    assert "batch inside the chain" in shard_advice(base(urls))
    text = shard_advice(base(urls).batched(2))
    assert "batch inside the chain" not in text and "batches already" in text, text


@pytest.mark.parametrize("wall_ms, limited", [(200.0, True), (20.0, False)])
def test_waiting_workers_beyond_the_shards_are_told_the_shards_are_the_limit(urls, wall_ms: float, limited: bool) -> None:
    from types import SimpleNamespace

    from fastpipe.diagnosis._diagnose import _advise
    from fastpipe.diagnosis.verdict._attribute import WorkerCost
    from fastpipe.diagnosis.verdict._report import Bottleneck

    stream = base(urls).batched(2)
    pipeline, _ = find_pipeline(stream)
    raw = Bottleneck("raw load", "raw load", 30.0, 2.0, 0.5, ("raw", "baseline"), False, cpu_ratio=0.1, waits=True)
    costs = {"raw load": WorkerCost(wall_ms=wall_ms, cpu_ms=2.0, wait_ms=wall_ms - 2.0)}
    # 2 samples a 40 ms step at wall_ms per sample: 200 ms -> 10 workers (over the 2 shards), 20 ms -> 1
    _advise(raw, pipeline, stream, 2, costs, SimpleNamespace(device_step_ms=40.0, batch_size=2), batch=2)
    text = raw.recommendation
    assert ("about 10 workers" if limited else "about 1 workers") in text, text
    assert ("the shards, not num_workers, are the limit" in text) is limited, text
