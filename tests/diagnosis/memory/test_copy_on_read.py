"""Copy-on-read growth: a dataset index held in Python objects grows the workers' memory and is named; one in NumPy does not."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from fastpipe.diagnosis.memory._copy_on_read import MIN_OBJECTS, find_containers, name_copy_on_read
from fastpipe.diagnosis.memory._loader import measure_loader_memory
from fastpipe.diagnosis.memory._shm_budget import MemoryLimits
from tests.fakes.memory import N, Packed, Records
from tests.fakes.memory import path_of as _path

ROOMY = MemoryLimits(shm_size=64 << 30, shm_free=64 << 30, cgroup_limit=None, cgroup_usage=None)


def _measure(dataset: Dataset):
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)
    return measure_loader_memory(loader, samples=5000, stall_max_s=2, limits=ROOMY)


@pytest.mark.slow  # 25-45 s on the loaded 2-core machine: two loaders of 2 workers reading 5,000 samples each
def test_python_index_grows_and_is_named_numpy_index_does_not() -> None:
    records, packed = Records(), Packed()
    grown, flat = _measure(records), _measure(packed)
    assert len(grown.workers) == len(flat.workers) == 2
    # the list of dicts: every worker's unique memory grows with what it reads, several times the NumPy one's drift
    assert all(w.grows for w in grown.workers), grown.to_table()
    assert not any(w.grows for w in flat.workers), flat.to_table()
    assert grown.growth_per_1000 > 4 * max(flat.growth_per_1000, 0), (grown.to_table(), flat.to_table())
    finding = name_copy_on_read(records, grown.growth_per_1000, grown.grows)
    assert finding is not None and [c.path for c in finding.containers] == ["Records.records"]
    assert finding.containers[0].length == N and finding.removed_per_1000 == [pytest.approx(grown.growth_per_1000)]
    assert "Records.records" in "\n".join(finding.lines())
    assert name_copy_on_read(packed, flat.growth_per_1000, flat.grows) is None
    assert find_containers(packed) == []


def test_the_fix_code_runs_and_keeps_every_field() -> None:
    dataset = Records(n=20_000)
    [container] = find_containers(dataset)
    assert container.keys == ["path", "label", "size"]
    namespace = {"self": dataset}
    exec(container.fix, namespace)  # the code as printed, run on the dataset itself
    assert not hasattr(dataset, "records")
    i = 12_345
    assert namespace["unpack_string"](dataset.path_bytes, dataset.path_offsets, i) == _path(i)
    assert dataset.label[i] == i % 1000 and tuple(dataset.size[i]) == (i % 640, i % 480)
    assert dataset.label.dtype != object and dataset.size.dtype != object


def test_walk_goes_through_subset_and_concat_and_names_the_path() -> None:
    nested = Subset(ConcatDataset([Packed(n=1000), Records(n=20_000)]), np.arange(5000))
    assert [c.path for c in find_containers(nested)] == ["Subset.dataset -> ConcatDataset.datasets[1] -> Records.records"]
    listed = Subset(Packed(n=50_000), list(range(1000, 50_000)))  # random_split's indices: a list of ints
    [indices] = find_containers(listed)
    assert indices.path == "Subset.indices" and indices.kind == "list of int"


class Holder(Dataset):
    def __init__(self, value) -> None:
        self.value = value

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        return 0


def test_what_counts_as_many_objects() -> None:
    assert find_containers(Holder(list(range(200)) * 1000)) == []  # small ints are shared, never copied
    assert find_containers(Holder(np.arange(MIN_OBJECTS * 2))) == []
    assert find_containers(Holder([_path(i) for i in range(MIN_OBJECTS // 2)])) == []
    [strings] = find_containers(Holder(np.array([_path(i) for i in range(MIN_OBJECTS)], dtype=object)))
    assert strings.kind == "numpy object array of str"
    [table] = find_containers(Holder({_path(i): i + 1000 for i in range(MIN_OBJECTS)}))
    assert table.kind == "dict of int" and table.objects >= 2 * MIN_OBJECTS


def test_pandas_object_columns_are_named() -> None:
    pandas = pytest.importorskip("pandas")
    paths = [_path(i) for i in range(MIN_OBJECTS * 2)]
    frame = pandas.DataFrame({"path": pandas.Series(paths, dtype=object), "label": np.arange(MIN_OBJECTS * 2)})
    [column] = find_containers(Holder(frame))
    assert column.path == "Holder.value['path']" and "pandas object column 'path'" in column.kind
    assert "string[pyarrow]" in column.fix
    frame["path"] = frame["path"].astype("string[pyarrow]")  # the fix: Arrow-backed, nothing left to name
    assert find_containers(Holder(frame)) == []
