"""fastpipe.distributed: the toy pipeline's CPU stages as Ray Data tasks on a small local cluster.

One cluster (2 CPUs, a small object store) serves every test that does not need fastpipe to own
it; the tests at the end of the file let fastpipe start its own cluster, to check that an error
and Ctrl-C shut it down. Sizes are tiny (raw 64, crop 32, batch 4, 32 samples).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from torch.utils.data import DataLoader, Dataset, IterableDataset  # noqa: E402

from fastpipe.devices import SimDevice  # noqa: E402
from fastpipe.diagnosis.discovery._pipeline import find_pipeline  # noqa: E402
from fastpipe.diagnosis.ladder._cache import CachePointDataset  # noqa: E402
from fastpipe.diagnosis.ladder._measure import measure_workload  # noqa: E402
from fastpipe.distributed import RayLoader, parse_stats, ray_stats_notes  # noqa: E402
from fastpipe.distributed import cluster as ray_cluster  # noqa: E402
from fastpipe.errors import ConfigError, OptionalDependencyError, PipelineError  # noqa: E402
from fastpipe.loading._prefetch import DevicePrefetcher  # noqa: E402
from fastpipe.transforms.device import ConvertColorScale  # noqa: E402
from fastpipe.workloads.toy.optimized import OPTIMIZED, make_toy_variant  # noqa: E402
from fastpipe.workloads.toy.ray import make_ray  # noqa: E402

SMALL = dict(batch_size=4, raw_size=64, img_size=32, length=32, model="resnet18")
OBJECT_STORE = 256 * 1024**2
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:.*pin_memory.*no accelerator"),  # the local toy DataLoader's, on this CPU-only machine
]


def start_test_cluster() -> None:
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=OBJECT_STORE, logging_level=logging.WARNING)
    # The datasets below live in this test module, which Ray workers cannot import: ship them by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def _module_cluster() -> Iterator[None]:
    yield
    ray.shutdown()


@pytest.fixture
def shared_ray(_module_cluster: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster this test process started (so fastpipe does not own it), kept across tests."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if not ray.is_initialized():
        start_test_cluster()


@pytest.fixture
def no_ray(_module_cluster: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No cluster running, so fastpipe starts (and owns) one; whatever happens, none is left afterwards."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.shutdown()
    yield
    ray_cluster.shutdown_owned()
    ray.shutdown()


class Indexed(Dataset):
    """uint8 images that carry their index, so arrivals can be counted; raises at ``fail_at``."""

    def __init__(self, length: int = 30, fail_at: int | None = None) -> None:
        self.length, self.fail_at = length, fail_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == self.fail_at:
            raise ValueError(f"sample {index} is corrupt")
        return torch.full((3, 4, 4), index % 256, dtype=torch.uint8), index


def toy_loader(**overrides: Any) -> DataLoader:
    options = {**SMALL, "num_workers": 0, **overrides}
    return make_toy_variant(SimDevice(1.0), OPTIMIZED, **options).loader


def epoch_images(loader: Any) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*loader)
    return torch.cat(images), torch.cat(labels)


# ----- no cluster needed -----------------------------------------------------------------
def test_importing_the_package_and_toy_variant_does_not_import_ray() -> None:
    code = "import sys, fastpipe.distributed, fastpipe.workloads.toy.ray; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastpipe.distributed._ray import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(OptionalDependencyError, match=r"pip install 'fastpipe\[ray\]'"):
        require_ray()


def test_settings_a_ray_loader_cannot_honour_are_refused() -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[int]:
            yield 0

    with pytest.raises(ConfigError, match="map-style"):
        RayLoader(Stream(), batch_size=2)
    with pytest.raises(ConfigError, match="worker_init_fn"):
        RayLoader.from_dataloader(DataLoader(Indexed(), batch_size=2, num_workers=1, worker_init_fn=lambda i: None))
    with pytest.raises(ConfigError, match="batch_size"):
        RayLoader.from_dataloader(DataLoader(Indexed(), batch_size=None))
    with pytest.raises(ConfigError, match="max_task_retries"):
        RayLoader(Indexed(), batch_size=2, max_task_retries=-1)


def test_stats_text_is_parsed_per_operator() -> None:
    text = (
        "Operator 1 MapBatches(load_batches): 8 tasks executed, 8 blocks produced in 1.5s\n"
        "* Remote wall time: 2.29ms min, 20.25ms max, 7.99ms mean, 63.95ms total\n"
        "* Remote cpu time: 1.53ms min, 6.88ms max, 3.27ms mean, 1.2s total\n"
        "* Tasks per node: 8 min, 8 max, 8 mean; 3 nodes used\n"
    )
    (op,) = parse_stats(text)
    assert (op.name, op.tasks, op.wall_s, op.nodes) == ("MapBatches(load_batches)", 8, 1.5, 3)
    assert op.task_wall_s == pytest.approx(0.06395) and op.task_cpu_s == pytest.approx(1.2)


# ----- on the shared cluster -------------------------------------------------------------
@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_ray_samples_match_the_local_pipeline(shared_ray: None) -> None:
    local_loader = toy_loader()
    ray_loader = RayLoader.from_dataloader(local_loader, num_cpus=2)
    assert ray_loader.dataset is local_loader.dataset and ray_loader.batch_size == 4 and len(ray_loader) == 8
    local_images, local_labels = epoch_images(local_loader)
    ray_images, ray_labels = epoch_images(ray_loader)

    assert ray_images.dtype == torch.uint8 and ray_labels.dtype == torch.int64
    assert ray_images.shape == local_images.shape == (32, 3, 32, 32)
    assert 0 <= int(ray_labels.min()) and int(ray_labels.max()) < 10
    # RandomMask zeroes a pixel when it or one of its 4 neighbours is drawn: ~1 - 0.75**5 = 76% inside the image.
    local_masked = (local_images == 0).all(dim=1).float().mean().item()
    ray_masked = (ray_images == 0).all(dim=1).float().mean().item()
    assert 0.6 < local_masked < 0.85 and abs(ray_masked - local_masked) < 0.03
    kept = ray_images[(ray_images != 0).any(dim=1, keepdim=True).expand_as(ray_images)].float()
    assert abs(kept.mean().item() - 127.5) < 3  # unmasked pixels stay uniform noise
    flat = ray_images.flatten(1)
    assert len({tuple(row[:64].tolist()) for row in flat}) == 32, "every sample is different: tasks are seeded per batch"


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_epochs_differ_but_a_torch_seed_repeats_them(shared_ray: None) -> None:
    loader = RayLoader.from_dataloader(toy_loader(), num_cpus=2)

    def checksums() -> list[int]:
        images, _ = epoch_images(loader)
        return sorted(int(x) for x in images.flatten(1).long().sum(1))

    torch.manual_seed(123)
    first = checksums()
    second = checksums()
    torch.manual_seed(123)
    assert checksums() == first
    assert second != first


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_of_an_epoch_arrives_exactly_once(shared_ray: None, drop_last: bool) -> None:
    loader = RayLoader(Indexed(30), batch_size=4, shuffle=True, drop_last=drop_last, num_cpus=2)
    expected = 28 if drop_last else 30  # drop_last drops the shuffled epoch's last 2 samples
    for _ in range(2):
        sizes, seen = [], []
        for images, indices in loader:
            sizes.append(len(indices))
            seen += indices.tolist()
            assert images.dtype == torch.uint8 and torch.equal(images[:, 0, 0, 0].long(), indices % 256)
        assert len(seen) == len(set(seen)) == expected and set(seen) <= set(range(30))
        assert sorted(sizes) == ([2] if not drop_last else []) + [4] * 7
    stats = loader.last_stats
    assert stats is not None and stats.batches == len(loader)
    (op,) = [op for op in stats.operators if "load_batches" in op.name]
    assert op.tasks == len(loader) and op.task_cpu_s is not None and op.task_cpu_s > 0
    assert any("load_batches" in note for note in ray_stats_notes(loader))


def test_a_task_that_raises_is_a_clear_error_and_leaves_a_cluster_it_did_not_start(shared_ray: None) -> None:
    loader = RayLoader(Indexed(30, fail_at=7), batch_size=4, num_cpus=2)
    started = time.perf_counter()
    with pytest.raises(PipelineError, match=r"dataset\[7\] raised ValueError: sample 7 is corrupt") as raised:
        for _ in loader:
            pass
    assert time.perf_counter() - started < 60
    assert raised.value.stage is None
    assert ray.is_initialized(), "the test started this cluster, so fastpipe must not stop it"


class Explode:
    """A transform stage that always fails."""

    def __call__(self, img: Any) -> Any:
        raise ZeroDivisionError("explode divides by zero")


def test_a_failing_stage_is_named_through_the_cache_wrapper(shared_ray: None) -> None:
    import torchvision.transforms as T

    from fastpipe.workloads.toy.dataset import FakeDataset

    dataset = FakeDataset(T.Compose([T.PILToTensor(), Explode()]), length=8, raw_size=(16, 16))
    pipeline, _ = find_pipeline(dataset)
    loader = RayLoader(CachePointDataset(dataset, pipeline, "baseline"), batch_size=4, num_cpus=2)
    with pytest.raises(PipelineError, match="stage 'Explode' raised ZeroDivisionError: explode divides by zero") as raised:
        list(loader)
    assert raised.value.stage == "Explode"


def test_prefetcher_and_device_transform_take_ray_batches(shared_ray: None) -> None:
    device = SimDevice(1.0)
    loader = RayLoader.from_dataloader(toy_loader(), num_cpus=2, device=device)
    assert loader.pin_memory
    host_images, _ = next(iter(loader))
    assert device.is_pinned(host_images), "pinned (in modelled pinned memory) before the trainer sees it"
    prefetcher = DevicePrefetcher(loader, device, depth=2, transform=ConvertColorScale())
    batches = list(prefetcher)
    assert len(batches) == len(loader) == 8
    images, labels = batches[0]
    assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32) and labels.dtype == torch.int64


def test_with_dataset_serves_one_cached_sample_per_worker_process(shared_ray: None) -> None:
    loader = RayLoader.from_dataloader(toy_loader(), num_cpus=2)
    cached = loader.with_dataset(CachePointDataset(loader.dataset, None, "sample", pool=1))
    assert cached.batch_sampler is loader.batch_sampler and cached.stats_history is loader.stats_history
    images, _ = epoch_images(cached)
    distinct = {tuple(row[:64].tolist()) for row in images.flatten(1)}
    assert 1 <= len(distinct) <= 4, f"{len(distinct)} distinct samples: one per Ray worker process expected"
    assert any(note.startswith("Ray Data (sample") for note in ray_stats_notes(loader))


def test_nodes_restrict_the_tasks_and_too_many_is_refused(shared_ray: None) -> None:
    loader = RayLoader(Indexed(8), batch_size=4, nodes=1)
    assert loader.num_workers == 2
    assert sorted(i for _, idx in loader for i in idx.tolist()) == list(range(8))
    with pytest.raises(ConfigError, match="1 live node"):
        list(RayLoader(Indexed(8), batch_size=4, nodes=2))


def test_toy_ray_runs_the_optimized_pipeline_on_ray(shared_ray: None) -> None:
    device = SimDevice(1.0)
    workload = make_ray(device, num_workers=2, **SMALL)
    assert isinstance(workload.loader, RayLoader) and workload.loader.num_workers == 2
    assert workload.device_transform is not None and workload.prefetch_depth > 0
    assert any("Ray Data tasks" in note for note in workload.notes)
    measurement = measure_workload(workload, device, warmup=1, steps=4)
    assert measurement.steps_per_s > 0


# ----- clusters fastpipe starts itself (keep these last: each starts a cluster) -------------------
@pytest.mark.slow
def test_an_error_shuts_down_the_cluster_fastpipe_started(no_ray: None) -> None:
    loader = RayLoader(Indexed(8, fail_at=1), batch_size=4, num_cpus=1, object_store_memory=128 * 1024**2)
    with pytest.raises(PipelineError, match=r"dataset\[1\]"):
        list(loader)
    assert not ray.is_initialized()


@pytest.mark.slow
def test_ctrl_c_in_the_training_loop_shuts_down_the_cluster_fastpipe_started(no_ray: None) -> None:
    original = signal.getsignal(signal.SIGINT)
    loader = RayLoader(Indexed(8), batch_size=4, num_cpus=1, object_store_memory=128 * 1024**2)
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            assert ray.is_initialized()
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, landing in the loop body
            time.sleep(30)
    assert not ray.is_initialized()
    assert signal.getsignal(signal.SIGINT) is original


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_leaving_the_with_block_shuts_down_the_cluster_fastpipe_started(no_ray: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        with RayLoader(Indexed(8), batch_size=4, num_cpus=1, object_store_memory=128 * 1024**2) as loader:
            epoch = iter(loader)  # starts the cluster; no batch is needed to test the exit path
            assert ray.is_initialized() and ray_cluster.owns_cluster()
            raise KeyboardInterrupt
    assert not ray.is_initialized()
    epoch.close()  # closing an epoch of a stopped cluster is harmless
