"""Four review findings on the streaming ladder, each reproduced on WebDataset shards of the photo corpus:
the copy discount counts the samples a cached batch holds, ``with_epoch`` does not shorten the stage-cost pass,
a buffered stream's why-not says what is true for a stream, and a stream's raw-load advice is about shards."""

from __future__ import annotations

import collections
import io
import random

import pytest
from torch.utils.data import DataLoader, IterableDataset

import fastpipe.stages
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._serve import probe_point
from fastpipe.diagnosis.ladder._stream import CachePointIterable, TimedStream
from fastpipe.diagnosis.stagecost import measure_stage_costs
from fastpipe.diagnosis.stagecost._timing import _ledger, _TimedRunner
from tests.fakes import Ticks, served

PHOTOS = 8  # one corpus of 8 photos in 4 shards: every pass over the shards yields 8 samples, in the same order
STEP = "sim:5"


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    wds = pytest.importorskip("webdataset")
    pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
    from PIL import Image

    from fastpipe.workloads.photos import build_corpus

    photos = build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=PHOTOS, seed=0, classes=4)
    files = sorted(photos.rglob("*.jpg"))
    out = photos.parent / "shards"
    out.mkdir()
    shards = [str(out / f"shard-{i:03d}.tar") for i in range(4)]
    for i, url in enumerate(shards):
        with wds.TarWriter(url) as sink:
            for f in files[i::4]:
                image = Image.open(f).convert("RGB")
                image.thumbnail((48, 48))
                data = io.BytesIO()
                image.save(data, format="JPEG", quality=90)
                sink.write({"__key__": f"{f.parent.name}_{f.stem}", "jpg": data.getvalue(), "cls": int(i)})
    return shards


def planted(sample: dict) -> dict:
    """The stage before ``batched`` whose cost the ladder measures (its time does not matter to the counts here)."""
    return sample


def to_tensor(sample: dict) -> dict:
    from torchvision.transforms.v2.functional import center_crop, pil_to_tensor

    return {**sample, "jpg": center_crop(pil_to_tensor(sample["jpg"]), [32, 32])}


def per_batch(batch: dict) -> dict:
    return batch


def chain(urls: list[str]):
    import webdataset as wds

    return wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil").map(planted).map(to_tensor)


# ----- 1: the copy discount after `batched` -------------------------------------------------------
def test_a_cached_batch_counts_its_samples_in_the_copy_ledger(urls) -> None:
    batch = 3
    stream = chain(urls).batched(batch).map(per_batch)
    pipeline, _ = find_pipeline(stream)
    assert pipeline.names() == ["decode", "planted", "to_tensor", "batched", "per_batch"]
    # after `batched` each cached item is a batch: 3 + 3 + 2 samples from the 8 photos (the last one partial)
    after = CachePointIterable(stream, pipeline, "after:batched", pool=3, clock=Ticks())
    items = served(after, 3)
    assert [len(item["jpg"]) for item in items] == [3, 3, 2]
    stats = after.copy_stats()
    assert stats.samples == PHOTOS and stats.copied == PHOTOS  # not 3 (one per batch)
    assert stats.seconds == pytest.approx(3.0)  # one second per batch copied ...
    assert after.copy_seconds_per_sample() == pytest.approx(3.0 / PHOTOS)  # ... is 3/8 s per sample, not 1 s
    # before `batched` each cached item is one sample: `batched` pulls 3 a batch (and one ahead), each copy counts 1
    before = CachePointIterable(stream, pipeline, "after:planted", pool=4, clock=Ticks())
    served(before, 2)
    stats = before.copy_stats()
    assert stats.samples == 2 * batch + 1 and stats.seconds == pytest.approx(stats.samples)


def test_uncollated_batches_count_their_samples_too(urls) -> None:
    stream = chain(urls).batched(4, collation_fn=None).map(per_batch)
    pipeline, _ = find_pipeline(stream)
    after = CachePointIterable(stream, pipeline, "after:batched", pool=2, clock=Ticks())
    assert [len(item) for item in served(after, 2)] == [4, 4]  # lists of 4 sample dicts
    assert after.copy_stats().samples == 8


# ----- 2: with_epoch and the stage-cost pass ------------------------------------------------------
def test_the_stage_cost_pass_keeps_the_chains_epoch_in_batches(urls) -> None:
    stream = chain(urls).batched(2).with_epoch(5)  # 5 batches (10 samples) an epoch: the shards are read again
    pipeline, _ = find_pipeline(stream)
    want = list(stream)
    assert [len(b["jpg"]) for b in want] == [2] * 5
    ledger = _ledger()
    ledger.take()
    got = list(TimedStream(stream, pipeline, _ledger, _TimedRunner))
    assert [len(b["jpg"]) for b in got] == [2] * 5, "the timed stream's epoch must be the user's: 5 full batches"
    assert ledger.take().samples == 11  # 10 in the batches, and the one `batched` reads to close the fifth


def test_stage_costs_of_a_short_epoch_time_the_samples_of_full_batches(urls) -> None:
    loader = DataLoader(chain(urls).batched(2).with_epoch(5), batch_size=None, num_workers=0)
    costs = measure_stage_costs(loader, STEP, step=lambda batch: None, steps=4, warmup=1)
    assert costs.samples == 4 * 2, costs.to_table() if hasattr(costs, "to_table") else costs


# ----- 3: a buffered stream's why-not --------------------------------------------------------------
class ShuffledStages(IterableDataset):
    """A declared stream that shuffles its finished samples in a buffer (as ``.shuffle(n)`` after the maps would)."""

    def __init__(self, urls: list[str], buffer: str = "shuffle") -> None:
        import webdataset as wds

        source = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")
        self.stages = fastpipe.stages.Stages(source=source, transforms=[planted, to_tensor])
        self.buffer = buffer

    def __iter__(self):
        if self.buffer == "webdataset":  # webdataset's own sample shuffle, on the finished samples
            import webdataset as wds

            yield from wds.filters.shuffle(4, initial=4, rng=random.Random(1))(iter(self.stages))
            return
        held: collections.deque = collections.deque()
        rng = random.Random(0)
        for sample in self.stages:
            held.append(sample)
            if len(held) >= 4:  # a shuffle buffer pops at random, a prefetch queue in order
                if self.buffer == "shuffle":
                    held.rotate(-rng.randrange(len(held)))
                yield held.popleft()
        yield from held


@pytest.mark.parametrize("buffer", ["shuffle", "prefetch", "webdataset"])
def test_a_buffered_stream_gets_a_why_not_for_streams(urls, buffer: str) -> None:
    dataset = ShuffledStages(urls, buffer)
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == ["planted", "to_tensor"]
    reason = probe_point(dataset, pipeline, "after:planted").reason
    assert reason is not None
    assert "Compose" not in reason and "return self.transform" not in reason, reason
    assert "buffer" in reason and "ShuffledStages.__iter__" in reason, reason
    assert "fastpipe.stages.Stages(source=" in reason, reason


def test_an_unbuffered_stream_that_changes_its_output_keeps_its_own_why_not(urls) -> None:
    class Changed(ShuffledStages):
        def __iter__(self):
            for sample in self.stages:
                yield {**sample, "jpg": sample["jpg"].float()}

    dataset = Changed(urls)
    pipeline, _ = find_pipeline(dataset)
    reason = probe_point(dataset, pipeline, "after:planted").reason
    assert reason is not None and "buffer" not in reason and "changes its transform's output" in reason, reason
    assert "Compose" not in reason and "yield" in reason, reason


# ----- 4: raw-load advice for a stream -------------------------------------------------------------
def test_raw_load_advice_for_a_webdataset_chain_is_about_shards(urls) -> None:
    from fastpipe.diagnosis.verdict._advice import recommend

    stream = chain(urls).batched(2)
    pipeline, _ = find_pipeline(stream)
    stages = [stage.transform for stage in pipeline.stages]  # what the diagnosis passes (_diagnose._advise)
    text = recommend("raw load", "raw load", transform=stages, dataset=stream).text()
    assert "shard" in text and "num_workers" in text and "4 shards" in text, text
    assert "ImageFolder" not in text and "__getitem__" not in text and "decode-the-crop" not in text, text
    span = recommend("raw load + decode", "span", transform=stages, dataset=stream).text()
    assert "4 shards" in span and "ImageFolder" not in span, span


def test_raw_load_advice_for_a_declared_stream_is_about_its_source(urls) -> None:
    from fastpipe.diagnosis.verdict._advice import recommend

    dataset = ShuffledStages(urls)
    pipeline, _ = find_pipeline(dataset)
    text = recommend("raw load", "raw load", transform=[s.transform for s in pipeline.stages], dataset=dataset).text()
    assert "source" in text and "ImageFolder" not in text and "decode-the-crop" not in text, text


def test_a_waiting_raw_load_of_a_webdataset_chain_keeps_the_shard_advice(urls) -> None:
    from types import SimpleNamespace

    from fastpipe.diagnosis._diagnose import _advise
    from fastpipe.diagnosis.verdict._attribute import WorkerCost
    from fastpipe.diagnosis.verdict._report import Bottleneck

    stream = chain(urls).batched(2)
    pipeline, _ = find_pipeline(stream)
    raw = Bottleneck("raw load", "raw load", 30.0, 2.0, 0.5, ("raw", "baseline"), False, cpu_ratio=0.1, waits=True)
    costs = {"raw load": WorkerCost(wall_ms=20.0, cpu_ms=2.0, wait_ms=18.0)}
    _advise(raw, pipeline, stream, 2, costs, SimpleNamespace(device_step_ms=40.0, batch_size=2), batch=2)
    assert "waits" in raw.recommendation and "4 shards" in raw.recommendation, raw.recommendation
