"""fastpipe.loading.unwrap_loader: timm's, accelerate's and fastpipe's wrappers are unwrapped, what they do kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset

from fastpipe.errors import ConfigError
from fastpipe.experiments._fix_checks import seed_all
from fastpipe.loading import DevicePrefetcher, unwrap_loader
from fastpipe.transforms.device import Normalize
from fastpipe.workloads._workload import as_workload
from tests.fakes import quick_options
from tests.fakes.fix import corpus

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus(tmp_path_factory.mktemp("photos") / "corpus", n=12)


def _timm_loader(root: Path, **options) -> object:
    from timm.data import create_loader

    dataset = torchvision.datasets.ImageFolder(str(root))
    return create_loader(dataset, 64, 4, is_training=True, num_workers=0, device=torch.device("cpu"), **options)


def _step(batch) -> None:
    return None


@pytest.mark.parametrize("re_prob", [0.0, 1.0])
def test_timm_prefetch_loader_is_a_loader_and_its_device_work_is_kept(photos: Path, re_prob: float) -> None:
    """create_loader's PrefetchLoader: the workload gets the DataLoader inside, and its device transform gives the model
    exactly what timm's loader gives it (Normalize, and RandomErasing when re_prob > 0), seeded alike.
    Fails before the unwrapping: as_workload refused it ("returned a PrefetchLoader where a ... DataLoader was expected")."""
    wrapped = _timm_loader(photos, re_prob=re_prob)
    workload = as_workload((wrapped, _step), "train:make")
    assert type(workload.loader) is DataLoader and workload.loader is wrapped.loader
    assert workload.prefetch_depth == 1 and any("PrefetchLoader" in note for note in workload.notes)
    assert ("RandomErasing" in repr(workload.device_transform)) == (re_prob > 0)
    seed_all(3)
    theirs, their_labels = next(iter(wrapped))
    seed_all(3)
    ours, our_labels = workload.device_transform(next(iter(workload.loader)))
    assert torch.equal(our_labels, their_labels)
    assert ours.dtype == theirs.dtype == torch.float32 and torch.equal(ours, theirs)


@pytest.mark.slow
def test_timm_loader_diagnosed_with_no_unwrapping_by_the_user(photos: Path) -> None:
    """fastpipe.diagnose takes timm's loader as create_loader returns it (it refused it before). About 20 s: slow."""
    import fastpipe

    report = fastpipe.diagnose(
        _timm_loader(photos), _step, device="sim:5", options=quick_options(steps=2, warmup=1, budget=1.0, stage_costs=False)
    )
    assert report.baseline_step_ms is not None and report.baseline_step_ms > 0
    assert any("PrefetchLoader unwrapped" in note for note in report.notes)


def test_timm_multi_epochs_loader_becomes_a_plain_dataloader(photos: Path) -> None:
    """MultiEpochsDataLoader's workers never end; the diagnosis gets a plain DataLoader with its settings and sampler."""
    wrapped = _timm_loader(photos, use_prefetcher=False, use_multi_epochs_loader=True)
    found = unwrap_loader(wrapped)
    assert type(found.loader) is DataLoader and found.loader.dataset is wrapped.dataset
    assert found.loader.batch_size == 4 and found.loader.sampler is wrapped.sampler and found.device_transform is None
    assert len(found.loader) == len(wrapped)


@pytest.mark.parametrize("kind", ["DataLoaderShard", "DataLoaderDispatcher"])
def test_accelerate_adapters_are_unwrapped(kind: str) -> None:
    """accelerate's adapters claim to be DataLoaders (a __class__ property); the DataLoader they prepared is diagnosed."""
    from accelerate import data_loader

    adapter = getattr(data_loader, kind)(TensorDataset(torch.arange(10.0)), batch_size=4)
    found = unwrap_loader(adapter)
    assert type(found.loader) is DataLoader and found.loader is adapter.base_dataloader
    assert kind in found.layers[0]


def test_fastpipe_prefetcher_keeps_its_transform_and_depth() -> None:
    loader = DataLoader(TensorDataset(torch.zeros(8, 3, 4, 4, dtype=torch.uint8), torch.arange(8)), batch_size=4)
    normalize = Normalize.imagenet()
    workload = as_workload((DevicePrefetcher(loader, "cpu", depth=3, transform=normalize), _step), "train:make")
    assert workload.loader is loader and workload.device_transform is normalize and workload.prefetch_depth == 3


def test_a_loader_fastpipe_cannot_unwrap_names_its_type_and_the_protocols() -> None:
    class OwnLoader:
        def __iter__(self):
            return iter([])

    with pytest.raises(ConfigError) as raised:
        as_workload((OwnLoader(), _step), "train:make")
    message = str(raised.value)
    assert "OwnLoader" in message and "WrapsLoader" in message and "RebuildsAroundDataset" in message
    assert "fastpipe/loading/_protocols.py" in message


def test_a_declared_wrapper_is_unwrapped() -> None:
    """A wrapper of the user's own declares WrapsLoader: its loader and its device transform are used."""
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)

    class OwnWrapper:
        wrapped_loader = loader

        @property
        def wrapped_device_transform(self):
            return _step

    found = unwrap_loader(OwnWrapper())
    assert found.loader is loader and found.device_transform is _step


def test_watch_around_timms_loader_is_unwrapped_layer_by_layer(photos: Path) -> None:
    """fastpipe.watch(create_loader(...)): both layers peeled, outermost first; timm's device work kept."""
    import fastpipe

    wrapped = _timm_loader(photos)
    found = unwrap_loader(fastpipe.watch(wrapped, echo=False, memory=False))
    assert found.loader is wrapped.loader and found.prefetch_depth == 1
    assert "watch" in found.layers[0] and "PrefetchLoader" in found.layers[1]
    assert "TimmPrefetchTransform" in repr(found.device_transform)
