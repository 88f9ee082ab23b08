"""Streams that repeat themselves (fastpipe.diagnosis.unseen._streams): planted unsharded, sharded, uneven streams and
WebDataset chains with and without split_by_worker, each read by 2 real DataLoader workers."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fastpipe.diagnosis.unseen._fingerprint import fingerprint
from fastpipe.diagnosis.unseen._streams import ITEMS_PER_WORKER, check_stream
from fastpipe.diagnosis.verdict._report import Report


class Unsharded(IterableDataset):
    """Every worker reads the whole source: the planted mistake."""

    def __init__(self, count: int = 100) -> None:
        self.count = count

    def __iter__(self):
        for i in range(self.count):
            yield torch.full((4,), float(i)), i % 10


class Sharded(Unsharded):
    def __iter__(self):
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, self.count, step):
            yield torch.full((4,), float(i)), i % 10


class Uneven(IterableDataset):
    """Disjoint shares, worker 0's four times worker 1's."""

    def __iter__(self):
        info = get_worker_info()
        worker = 0 if info is None else info.id
        for i in range(20 if worker == 0 else 5):
            yield torch.full((4,), float(2 * i + worker))


def loader(dataset, workers: int = 2) -> DataLoader:
    return DataLoader(dataset, batch_size=4, num_workers=workers)


def test_an_unsharded_stream_repeats_itself_in_every_worker_and_the_fix_uses_get_worker_info() -> None:
    check = check_stream(loader(Unsharded()))
    assert check.counts == [ITEMS_PER_WORKER, ITEMS_PER_WORKER]
    assert check.duplicated == 2 * ITEMS_PER_WORKER and check.distinct == ITEMS_PER_WORKER
    assert check.shared == [("worker 0", "worker 1", ITEMS_PER_WORKER)]
    text = "\n".join(check.lines())
    assert "duplicates: 64 of 64" in text and "get_worker_info()" in text and "about 2 times" in text
    assert not check.uneven


def test_a_sharded_stream_has_no_duplicates_and_even_shares() -> None:
    check = check_stream(loader(Sharded()))
    assert check.duplicated == 0 and check.distinct == 2 * ITEMS_PER_WORKER and not check.uneven
    assert len(check.lines()) == 1 and "no duplicates" in check.lines()[0]


def test_an_uneven_split_names_the_worker_that_runs_out_first() -> None:
    check = check_stream(loader(Uneven()))
    assert check.counts == [20, 5] and check.duplicated == 0
    assert check.uneven and check.short == ["worker 1"]
    assert "uneven shares: worker 1 ran out first" in "\n".join(check.lines())


def test_one_item_more_or_less_is_not_uneven() -> None:
    class Almost(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            yield from (torch.tensor([float(i)]) for i in range(info.id, 11, 2))  # 6 and 5 items

    check = check_stream(loader(Almost()))
    assert check.counts == [6, 5] and not check.uneven


def test_a_random_augmentation_after_the_key_does_not_hide_copies_of_a_keyed_item() -> None:
    a = {"__key__": "s0_1", "__url__": "shard-0.tar", "jpg": torch.rand(3)}
    b = {"__key__": "s0_1", "__url__": "shard-0.tar", "jpg": torch.rand(3)}
    assert fingerprint(a) == fingerprint(b) == ("shard-0.tar/s0_1", "__key__")
    assert fingerprint((torch.ones(2), 1))[0] != fingerprint((torch.ones(2), 2))[0]
    assert fingerprint((torch.ones(2), 1)) == fingerprint((torch.ones(2), 1))


def test_a_loader_that_is_not_a_stream_or_has_one_source_is_not_checked() -> None:
    assert check_stream(DataLoader(list(range(8)), batch_size=2)) is None
    assert check_stream(loader(Unsharded(), workers=0)) is None  # nothing to compare, outside DDP


def test_a_worker_init_fn_that_configures_the_dataset_still_works() -> None:
    """PyTorch's documented pattern: worker_init_fn sets each worker's range on get_worker_info().dataset."""

    class Ranged(IterableDataset):
        def __init__(self) -> None:
            self.start, self.end = 0, 64

        def __iter__(self):
            return iter(torch.tensor([float(i)]) for i in range(self.start, self.end))

    check = check_stream(DataLoader(Ranged(), batch_size=2, num_workers=2, worker_init_fn=split_range))
    assert check.duplicated == 0 and check.counts == [ITEMS_PER_WORKER, ITEMS_PER_WORKER]


def split_range(worker_id: int) -> None:
    info = get_worker_info()
    dataset = info.dataset
    per = (dataset.end - dataset.start) // info.num_workers
    dataset.start, dataset.end = dataset.start + worker_id * per, dataset.start + (worker_id + 1) * per


# ----- WebDataset --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    wds = pytest.importorskip("webdataset")
    folder = tmp_path_factory.mktemp("shards")
    urls = []
    for s in range(4):
        url = str(folder / f"shard-{s}.tar")
        with wds.TarWriter(url) as sink:
            for k in range(10):
                sink.write({"__key__": f"{s}_{k:02d}", "txt": f"shard {s} item {k}", "cls": k})
        urls.append(url)
    return urls


def jitter(sample: tuple) -> tuple:
    """A random augmentation: copies of one sample differ in their bytes after it."""
    text, label = sample
    return text + f" {torch.rand(1).item():.6f}", label


def chain(urls: list[str], split: bool):
    import webdataset as wds

    steps = [wds.SimpleShardList(urls), *([wds.split_by_worker] if split else []), wds.tarfile_to_samples()]
    return wds.DataPipeline(*steps, wds.decode(), wds.to_tuple("txt", "cls"), wds.map(jitter))


def test_a_webdataset_chain_without_split_by_worker_repeats_itself_and_is_told_to_split(shards) -> None:
    check = check_stream(DataLoader(chain(shards, split=False), batch_size=None, num_workers=2))
    assert check.kind == "webdataset" and check.basis == "__key__"  # read up to its last keyed step, before jitter
    assert check.duplicated == 2 * ITEMS_PER_WORKER
    text = "\n".join(check.lines())
    assert "wds.split_by_worker" in text and "wds.split_by_node" in text


def test_a_webdataset_chain_with_split_by_worker_has_no_duplicates(shards) -> None:
    check = check_stream(DataLoader(chain(shards, split=True), batch_size=None, num_workers=2))
    assert check.duplicated == 0 and check.counts == [20, 20] and not check.uneven


def test_three_shards_over_two_workers_is_an_uneven_split(shards) -> None:
    check = check_stream(DataLoader(chain(shards[:3], split=True), batch_size=None, num_workers=2))
    assert check.counts == [20, 10] and check.uneven and check.short == ["worker 1"]
    assert "wds.ResampledShards" in "\n".join(check.lines())


# ----- the report ----------------------------------------------------------------------------------
def test_the_report_shows_the_stream_section_in_text_json_and_markdown() -> None:
    report = Report(
        workload="w", device="sim:10", num_workers=2, batch_size=4, steps=4, warmup=1, pool=1, threshold=0.05, strategy="linear"
    )
    report.streams = check_stream(loader(Unsharded()))
    assert "duplicates: 64 of 64" in report.to_table()
    assert "#### Streams" in report.to_markdown() and "get_worker_info" in report.to_markdown()
    data = json.loads(report.to_json())
    assert data["streams"]["duplicates"] is True and data["streams"]["duplicated"] == 64
    assert data["startup"] is None and data["main_process"] is None


def test_a_hugging_face_stream_with_fewer_shards_than_workers_leaves_a_worker_idle() -> None:
    datasets = pytest.importorskip("datasets")
    stream = datasets.Dataset.from_dict({"x": list(range(40))}).to_iterable_dataset(num_shards=1)
    check = check_stream(DataLoader(stream, batch_size=None, num_workers=2))
    assert check.kind == "hf" and check.duplicated == 0
    assert check.counts == [ITEMS_PER_WORKER, 0] and check.short == ["worker 1"]


@pytest.mark.slow
@pytest.mark.parametrize("by_rank", [False, True])
def test_under_ddp_ranks_that_read_the_same_items_are_reported_and_rank_sharding_clears_it(tmp_path, by_rank: bool) -> None:
    import torch.multiprocessing as mp

    from tests.fakes.ddp import free_port
    from tests.fakes.stream_ddp import check_rank

    mp.spawn(check_rank, args=(2, free_port(), str(tmp_path), by_rank), nprocs=2, join=True)
    checks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for check in checks:
        check.pop("seconds")  # each rank's own cost
    assert checks[0] == checks[1]  # every rank holds the same comparison
    check = checks[0]
    assert check["sources"] == ["rank 0 worker 0", "rank 0 worker 1", "rank 1 worker 0", "rank 1 worker 1"]
    if by_rank:
        assert check["duplicated"] == 0
    else:
        assert check["duplicated"] == 4 * ITEMS_PER_WORKER
        assert ["rank 0 worker 0", "rank 1 worker 0", ITEMS_PER_WORKER] in check["shared"]
