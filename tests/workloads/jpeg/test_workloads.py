"""The jpeg: reference workloads build on a tiny corpus, yield batches the step takes, and pick the jpeg sim step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastpipe.devices import DEFAULT_SIM_STEP_MS, parse_device
from fastpipe.errors import ConfigError
from fastpipe.transforms import Normalize
from fastpipe.workloads.jpeg import DEFAULT_SIM_SPEC, JPEG_SIM_STEP_MS, LADDER, VARIANTS, make_workload

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")

SMALL = dict(n=12, batch_size=3, num_workers=0, img_size=32, model="resnet18", pin_memory=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jpeg") / "corpus"


def first_batch(workload):
    batch = next(iter(workload.loader))
    return workload.device_transform(batch) if workload.device_transform is not None else batch


def test_naive_is_the_usual_recipe_and_trains_on_cpu(root: Path) -> None:
    workload = make_workload("naive", parse_device("cpu"), root=root, **SMALL)
    assert workload.name == "jpeg:naive" and workload.device_transform is None and workload.prefetch_depth == 0
    names = [type(t).__name__ for t in workload.loader.dataset.transform.transforms]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    images, labels = first_batch(workload)
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (3,)
    assert workload.loader.pin_memory is False and workload.model is not None
    workload.step((images, labels))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "naive"])
def test_every_fixed_variant_yields_what_the_step_takes(root: Path, variant: str) -> None:
    workload = make_workload(variant, parse_device("cpu"), root=root, **SMALL)
    raw = next(iter(workload.loader))
    if variant in ("uint8-host", "optimized", "threads"):
        assert raw[0].dtype == torch.uint8 and isinstance(workload.device_transform, Normalize)
    images, labels = first_batch(workload)
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32
    assert workload.prefetch_depth == (2 if variant in ("optimized", "device-decode", "threads") else 0)
    workload.step((images, labels))


def test_optimized_feeds_the_model_what_naive_does(root: Path) -> None:
    """Same seed, same shuffle, same boxes and flips: the model's input differs only by the resampling (op vs PIL)."""
    batches = {}
    for variant in ("naive", "optimized"):
        workload = make_workload(variant, parse_device("cpu"), root=root, **{**SMALL, "batch_size": 12})
        torch.manual_seed(11)
        batches[variant] = first_batch(workload)
    assert torch.equal(batches["naive"][1], batches["optimized"][1])
    levels = (batches["naive"][0] - batches["optimized"][0]).abs() * 255 * 0.224  # back to 0..255 levels, roughly
    assert levels.mean().item() < 3.0


def test_threads_shuffles_as_optimized_does(root: Path) -> None:
    """jpeg:threads takes jpeg:optimized's seeded sampler: the same samples in the same order, decoded by threads."""
    labels = {}
    for variant in ("optimized", "threads"):
        workload = make_workload(variant, parse_device("cpu"), root=root, **{**SMALL, "batch_size": 12})
        torch.manual_seed(11)
        labels[variant] = first_batch(workload)[1]
    assert torch.equal(labels["optimized"], labels["threads"])


def test_decode_crop_rung_changes_only_the_dataset_class(root: Path) -> None:
    """The rung is the naive code with fastpipe's class in place of torchvision's: same transform object layout, same
    batches for the same seed (within the op's tolerance), and the decoder took the crop, the flip and ToTensor over."""
    naive = make_workload("naive", parse_device("cpu"), root=root, **{**SMALL, "batch_size": 12})
    fast = make_workload("decode-crop", parse_device("cpu"), root=root, **{**SMALL, "batch_size": 12})
    assert type(naive.loader.dataset).__name__ == type(fast.loader.dataset).__name__ == "ImageFolder"
    assert repr(naive.loader.dataset.transform) == repr(fast.loader.dataset.transform)
    assert fast.loader.dataset.fast_path.absorbed == ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor")
    torch.manual_seed(5)
    images_naive, labels_naive = first_batch(naive)
    torch.manual_seed(5)
    images_fast, labels_fast = first_batch(fast)
    assert torch.equal(labels_naive, labels_fast) and images_fast.dtype == images_naive.dtype
    levels = (images_naive - images_fast).abs() * 255 * 0.224  # back to 0..255 levels, roughly
    assert levels.mean().item() < 2.5


def test_sim_runs_no_model_and_the_default_sim_step_is_scaled_from_the_toys(root: Path) -> None:
    assert JPEG_SIM_STEP_MS == pytest.approx(DEFAULT_SIM_STEP_MS * (224 / 256) ** 2)
    assert DEFAULT_SIM_SPEC == f"sim:{round(JPEG_SIM_STEP_MS)}" == "sim:222"
    workload = make_workload("optimized", parse_device(DEFAULT_SIM_SPEC), root=root, **SMALL)
    assert workload.model is None and any("not run on sim:222" in note for note in workload.notes)


def test_load_workload_dispatches_jpeg_specs(root: Path) -> None:
    from fastpipe.workloads._workload import load_workload

    workload = load_workload("jpeg:uint8-host", "cpu", root=root, **SMALL)
    assert workload.name == "jpeg:uint8-host"
    assert [spec for _, spec in LADDER] == ["jpeg:naive", "jpeg:decode-crop", "jpeg:uint8-host", "jpeg:optimized", "jpeg:threads"]


def test_unknown_variants_and_toy_only_options_are_clear_errors(root: Path) -> None:
    with pytest.raises(ConfigError, match="jpeg:naive"):
        make_workload("fastest", parse_device("cpu"), root=root, **SMALL)
    with pytest.raises(ConfigError, match="raw_size"):
        make_workload("naive", parse_device("cpu"), root=root, raw_size=1024)
