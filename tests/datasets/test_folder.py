"""fastpipe.datasets: the ImageFolder drop-in against torchvision's, the crop distribution, and GPU decoding on the CPU."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image
from scipy import stats
from torch.utils.data import DataLoader

import fastpipe.ops.jpeg as jpeg_ops
from fastpipe._tree import map_tensors
from fastpipe.datasets import (
    DecodeCropLoader,
    DecodeCropOnDevice,
    EncodedBatch,
    EncodedImageFolder,
    ImageFolder,
    collate_encoded,
    crop_params,
)
from fastpipe.errors import ConfigError, FastpipeError
from fastpipe.transforms import Normalize

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=20, seed=0, classes=4)


@pytest.fixture(scope="module")
def messy(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus plus what real folders hold: a PNG, a nested folder, a non-image, a class with odd names."""
    root = tmp_path_factory.mktemp("messy") / "root"
    shutil.copytree(corpus, root)
    some_jpeg = next(root.rglob("*.jpg"))
    Image.open(some_jpeg).convert("RGB").save(root / "class_1" / "zz.png")
    (root / "class_2" / "nested").mkdir()
    shutil.copy(some_jpeg, root / "class_2" / "nested" / "a.JPEG")
    (root / "class_3" / "readme.txt").write_text("not an image")
    (root / "Another class").mkdir()
    shutil.copy(some_jpeg, root / "Another class" / "b.jpeg")
    return root


def test_same_classes_order_and_labels_as_torchvision(messy: Path) -> None:
    ours, theirs = ImageFolder(messy), torchvision.datasets.ImageFolder(messy)
    assert ours.classes == theirs.classes and ours.class_to_idx == theirs.class_to_idx
    assert ours.samples == theirs.samples and ours.targets == theirs.targets and len(ours) == len(theirs)
    encoded = EncodedImageFolder(messy)
    assert encoded.samples == theirs.samples and encoded.classes == theirs.classes
    png = dict(is_valid_file=lambda p: p.endswith(".png"), allow_empty=True)
    only_png = ImageFolder(messy, **png)
    assert only_png.samples == torchvision.datasets.ImageFolder(messy, **png).samples and len(only_png) == 1
    with pytest.raises(FileNotFoundError, match="no valid file"):  # torchvision's own check, kept
        ImageFolder(messy, is_valid_file=lambda p: p.endswith(".png"))


def test_samples_are_uint8_crops_with_the_label(messy: Path) -> None:
    dataset = ImageFolder(messy, size=(48, 64), target_transform=lambda t: t * 10)
    for index in (0, len(dataset) - 1):  # a JPEG and a PNG (PIL path, same semantics)
        image, target = dataset[index]
        assert image.dtype == torch.uint8 and image.shape == (3, 48, 64) and image.is_contiguous()
        assert target == dataset.targets[index] * 10
    assert ImageFolder(messy, size=32, transform=lambda x: x.float())[0][0].dtype == torch.float32


def test_every_corpus_flavour_gives_three_channels(corpus: Path) -> None:
    dataset = ImageFolder(corpus, size=40)
    modes = {Image.open(path).mode for path, _ in dataset.samples}
    assert modes == {"RGB", "L", "CMYK"}
    assert all(dataset[i][0].shape == (3, 40, 40) for i in range(len(dataset)))


def record_crops(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Spy on the op's calls: (box, size, hflip) as the dataset asked for them."""
    calls: list[tuple] = []
    real = jpeg_ops.decode_jpeg_crop

    def spy(source, box, size, hflip=False):
        calls.append((tuple(box), tuple(size), bool(hflip)))
        return real(source, box, size, hflip)

    monkeypatch.setattr(jpeg_ops, "decode_jpeg_crop", spy)
    return calls


def test_same_seed_same_boxes_and_flips_as_the_usual_recipe(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draws are torchvision's own, in its order: a seeded run crops exactly where torchvision's would."""
    calls = record_crops(monkeypatch)
    ours = ImageFolder(corpus, size=64, scale=(0.2, 1.0))
    crop, flip = T.RandomResizedCrop(64, scale=(0.2, 1.0)), T.RandomHorizontalFlip()
    torch.manual_seed(7)
    images = [ours[i][0] for i in range(len(ours))]
    torch.manual_seed(7)
    expected = []
    for path, _ in ours.samples:
        pil = Image.open(path).convert("RGB")
        box = T.RandomResizedCrop.get_params(pil, list(crop.scale), list(crop.ratio))
        flipped = bool(torch.rand(1) < flip.p)
        expected.append((box, (64, 64), flipped))
        reference = T.functional.resized_crop(T.functional.pil_to_tensor(pil), *box, [64, 64], antialias=True)
        reference = reference.flip(-1) if flipped else reference
        diff = (images[len(expected) - 1].float() - reference.float()).abs()
        assert diff.mean().item() < 3.0, path  # same crop and flip; only the resampling differs (op vs torchvision)
    assert calls == expected
    assert any(flipped for *_, flipped in calls) and not all(flipped for *_, flipped in calls)


def test_no_flip_draw_when_hflip_is_zero(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record_crops(monkeypatch)
    torch.manual_seed(1)
    [ImageFolder(corpus, size=16, hflip=0.0)[i] for i in range(5)]
    torch.manual_seed(1)
    boxes = [T.RandomResizedCrop.get_params(Image.open(p), [0.08, 1.0], [3 / 4, 4 / 3]) for p, _ in ImageFolder(corpus).samples[:5]]
    assert [c[0] for c in calls] == boxes and not any(c[2] for c in calls)


def box_features(boxes: np.ndarray, height: int, width: int) -> dict[str, np.ndarray]:
    top, left, h, w = boxes.T.astype(float)
    return {"area": h * w / (height * width), "aspect": w / h, "centre_x": (left + w / 2) / width, "centre_y": (top + h / 2) / height}


def v2_boxes(height: int, width: int, draws: int, scale: tuple[float, float] = (0.08, 1.0)) -> np.ndarray:
    """Boxes from torchvision.transforms.v2's RandomResizedCrop: its own implementation of the same distribution."""
    transform = v2.RandomResizedCrop(8, scale=scale)
    image = torch.empty(3, height, width, dtype=torch.uint8)
    out = []
    for _ in range(draws):
        p = transform.make_params([image])
        out.append((p["top"], p["left"], p["height"], p["width"]))
    return np.array(out)


@pytest.mark.parametrize("height, width", [(375, 500), (500, 333)])
def test_crop_box_distribution_equals_torchvisions(height: int, width: int) -> None:
    """KS tests, 3000 draws each, fixed seeds: our boxes against torchvision v2's, independently seeded."""
    draws = 3000
    torch.manual_seed(1234)
    ours = box_features(np.array([crop_params(height, width) for _ in range(draws)]), height, width)
    torch.manual_seed(98765)
    theirs = box_features(v2_boxes(height, width, draws), height, width)
    for name in ours:
        assert stats.ks_2samp(ours[name], theirs[name]).pvalue > 0.001, name
    torch.manual_seed(98765)  # the test can fail: a different scale range is detected at once
    narrower = box_features(v2_boxes(height, width, draws, scale=(0.2, 1.0)), height, width)
    assert stats.ks_2samp(ours["area"], narrower["area"]).pvalue < 1e-6


def test_loader_for_torchvisions_imagefolder(corpus: Path) -> None:
    loader = DecodeCropLoader(32, hflip=0.0)
    dataset = torchvision.datasets.ImageFolder(corpus, loader=loader)
    image, target = dataset[3]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and target == dataset.targets[3]
    again = pickle.loads(pickle.dumps(loader))  # workers started with spawn get a copy
    assert again.size == (32, 32) and again.hflip == 0.0
    batch = next(iter(DataLoader(dataset, batch_size=4, num_workers=1)))
    assert batch[0].shape == (4, 3, 32, 32) and batch[0].dtype == torch.uint8
    normalized = Normalize.imagenet()(batch)[0]
    assert normalized.dtype == torch.float32 and normalized.shape == (4, 3, 32, 32)


def test_bad_files_and_arguments_name_what_to_fix(tmp_path: Path, corpus: Path) -> None:
    bad = tmp_path / "cls" / "broken.jpg"
    bad.parent.mkdir()
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    with pytest.raises(FastpipeError, match="broken.jpg"):
        DecodeCropLoader(32)(bad)
    with pytest.raises(ConfigError, match="size"):
        ImageFolder(corpus, size=0)
    with pytest.raises(ConfigError, match="scale"):
        ImageFolder(corpus, scale=(1.0, 0.5))
    with pytest.raises(ConfigError, match="hflip"):
        DecodeCropLoader(32, hflip=2)
    with pytest.raises(FileNotFoundError):
        ImageFolder(tmp_path / "nothing here")


def test_encoded_batches_stay_on_the_host_through_copies(corpus: Path) -> None:
    dataset = EncodedImageFolder(corpus)
    data, target = dataset[0]
    assert data.dtype == torch.uint8 and data.dim() == 1 and bytes(data[:3].tolist()) == b"\xff\xd8\xff"
    assert data.numel() == Path(dataset.samples[0][0]).stat().st_size and target == dataset.targets[0]
    batch = collate_encoded([dataset[i] for i in range(4)])
    assert isinstance(batch[0], EncodedBatch) and len(batch[0]) == 4 and torch.equal(batch[1], torch.tensor(dataset.targets[:4]))
    moved = map_tensors(lambda t: t.to("meta"), batch)  # what a prefetcher's copy does
    assert moved[0] is batch[0] and moved[1].device.type == "meta"


def test_decode_crop_on_device_runs_on_cpu_through_the_same_code(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(EncodedImageFolder(corpus), batch_size=5, num_workers=1, collate_fn=collate_encoded)
    files, labels = next(iter(loader))
    transform = DecodeCropOnDevice(48)
    torch.manual_seed(3)
    images, out_labels = transform((files, labels))
    assert images.shape == (5, 3, 48, 48) and images.dtype == torch.uint8 and images.device.type == "cpu"
    assert out_labels is labels
    # The boxes are torchvision's draws on the decoded sizes, box then flip, image by image.
    torch.manual_seed(3)
    sizes = [Image.open(path).size for path, _ in loader.dataset.samples[:5]]
    expected = [(crop_params(h, w), bool(torch.rand(1) < 0.5)) for w, h in sizes]
    seen: list = []
    real = crop_params
    monkeypatch.setattr("fastpipe.datasets.device_decode.crop_params", lambda *a: seen.append(real(*a)) or seen[-1])
    torch.manual_seed(3)
    transform((files, labels))
    assert seen == [box for box, _ in expected]
    normalized = DecodeCropOnDevice(48, normalize=Normalize.imagenet())(files)
    assert normalized.dtype == torch.float32 and normalized.shape == (5, 3, 48, 48)


def test_device_decode_matches_the_image(corpus: Path) -> None:
    """Whole-image crops (scale 1, any ratio) of every flavour equal PIL's decode and resize closely."""
    dataset = EncodedImageFolder(corpus)
    files = EncodedBatch([dataset[i][0] for i in range(len(dataset))])
    images = DecodeCropOnDevice((30, 40), scale=(1.0, 1.0), ratio=(0.1, 10.0), hflip=0.0, device="cpu")(files)
    for image, (path, _) in zip(images, dataset.samples):
        pil = Image.open(path).convert("RGB").resize((40, 30), Image.BILINEAR, reducing_gap=None)
        reference = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float()
        assert (image.float() - reference).abs().mean().item() < 4.0, path  # CMYK and greyscale included


def test_decode_crop_on_device_rejects_decoded_batches() -> None:
    with pytest.raises(ConfigError, match="collate_encoded"):
        DecodeCropOnDevice(32)((torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2)))


@pytest.mark.gpu
def test_decode_crop_on_cuda_matches_cpu(corpus: Path) -> None:
    dataset = EncodedImageFolder(corpus)
    files, labels = collate_encoded([dataset[i] for i in range(len(dataset))])
    transform = DecodeCropOnDevice(64)
    torch.manual_seed(5)
    on_gpu, gpu_labels = transform((files, labels.cuda()))
    torch.manual_seed(5)
    on_cpu, _ = transform((files, labels))
    assert on_gpu.device.type == "cuda" and gpu_labels.device.type == "cuda" and on_gpu.shape == on_cpu.shape
    assert (on_gpu.cpu().float() - on_cpu.float()).abs().mean().item() < 2.0  # nvjpeg vs libjpeg-turbo IDCT and upsampling


def test_stages_are_declared_for_diagnose(corpus: Path, tmp_path: Path) -> None:
    """Reading the file is the raw load, then DecodeCrop, then the user's transform: fastpipe times each."""
    from fastpipe.diagnosis.discovery._pipeline import find_pipeline

    dataset = ImageFolder(corpus, size=24, transform=Normalize.imagenet())
    pipeline, why_not = find_pipeline(dataset)
    assert why_not is None and pipeline is not None and [s.name for s in pipeline.stages] == ["DecodeCrop", "Normalize"]
    raw = dataset.stages.load(0)
    assert raw.dtype == torch.uint8 and raw.numel() == Path(dataset.samples[0][0]).stat().st_size
    dataset.transform = None  # set later, as torchvision users do: the stages follow
    assert [type(t).__name__ for t in dataset.stages.transforms] == ["DecodeCrop"] and dataset[0][0].dtype == torch.uint8
    bad = tmp_path / "broken" / "x.jpg"
    bad.parent.mkdir()
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    with pytest.raises(FastpipeError, match="broken/x.jpg"):
        ImageFolder(tmp_path, size=8)[0]
    with pytest.raises(OSError):  # nothing absorbed: PIL decodes, and raises what torchvision's class raises
        ImageFolder(tmp_path)[0]


def test_a_file_the_batched_decoder_refuses_is_decoded_alone(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As when nvjpeg refuses a CMYK file: the batch is retried file by file, falling back to the CPU decoder."""
    import torchvision.io

    dataset = EncodedImageFolder(corpus)
    files = EncodedBatch([dataset[i][0] for i in range(6)])
    torch.manual_seed(0)
    expected = DecodeCropOnDevice(24)(files)
    real = torchvision.io.decode_jpeg

    def refuses_batches(input, *args, **kwargs):
        if isinstance(input, list):
            raise RuntimeError("nvjpeg: unsupported colour space")
        return real(input, *args, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", refuses_batches)
    torch.manual_seed(0)
    assert torch.equal(DecodeCropOnDevice(24)(files), expected)
    broken = EncodedBatch([files[0], torch.tensor([0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3], dtype=torch.uint8)])
    with pytest.raises(FastpipeError, match="file #1 of the batch"):
        DecodeCropOnDevice(24)(broken)
