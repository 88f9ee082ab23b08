"""Each stage gets its own remedy, with a snippet that runs against fastpipe's real API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader

from fastpipe.diagnosis.verdict._advice import COLLATE, COPY, RAW, TRANSFORM, WORKERS, Advice, recommend, ships_uint8

IMAGENET = T.Compose(
    [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
)
COMPILED_KERNEL_WORDS = ("Numba", "C++", "compile")

ALL_CASES = [
    ("RandomResizedCrop", TRANSFORM),
    ("RandomCrop", TRANSFORM),
    ("CenterCrop", TRANSFORM),
    ("Resize", TRANSFORM),
    ("RandomHorizontalFlip", TRANSFORM),
    ("ToTensor", TRANSFORM),
    ("Normalize", TRANSFORM),
    ("PILToTensor", TRANSFORM),
    ("RandomMask", TRANSFORM),
    ("ConvertColor", TRANSFORM),
    (RAW, RAW),
    (COLLATE, COLLATE),
    (COPY, COPY),
    ("workers", WORKERS),
    ("raw load + PILToTensor + collate/IPC", TRANSFORM),
]


def run_snippet(advice: Advice, **names) -> dict:
    assert advice.snippet is not None
    namespace = dict(names)
    exec(compile(advice.snippet, "<advice snippet>", "exec"), namespace)
    return namespace


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """An ImageFolder of two classes of 500x375 JPEGs (the size of a typical photo dataset's images)."""
    generator = torch.Generator().manual_seed(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            pixels = torch.randint(0, 256, (375, 500, 3), dtype=torch.uint8, generator=generator).numpy()
            Image.fromarray(pixels).save(tmp_path / cls / f"{i}.jpg", quality=90)
    return tmp_path


@pytest.mark.parametrize("stage, kind", ALL_CASES)
def test_every_snippet_compiles_and_every_summary_names_the_stage(stage: str, kind: str) -> None:
    advice = recommend(stage, kind, transform=IMAGENET)
    assert advice.summary and "\n" not in advice.summary
    if advice.snippet is not None:
        compile(advice.snippet, f"<{stage}>", "exec")
    if kind != WORKERS:
        assert stage.split(" + ")[0].lower() in advice.summary.lower()


def test_random_resized_crop_gets_decode_and_crop_not_a_compiled_kernel() -> None:
    advice = recommend("RandomResizedCrop", TRANSFORM, transform=IMAGENET)
    zero_change = advice.summary.index("fastpipe.datasets.ImageFolder(root, transform=the_same_transform)")
    assert zero_change < advice.summary.index("ImageFolder(root, size=224)") < advice.summary.index("DecodeCropLoader(224)")
    assert "dataset = ImageFolder(root, transform=transform)" in advice.snippet.splitlines()[6]  # the first code line
    assert not any(word in advice.summary for word in COMPILED_KERNEL_WORDS)
    assert "RandomMask" not in advice.summary


def test_the_to_tensor_fastpipes_image_folder_keeps_gets_the_uint8_advice() -> None:
    import fastpipe.datasets

    val_recipe = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    stages = fastpipe.datasets.absorb(IMAGENET).decode, *fastpipe.datasets.absorb(IMAGENET).rest  # as a diagnosis holds them
    advice = recommend("ToTensor", TRANSFORM, transform=list(stages))
    assert "Ship uint8" in advice.summary and "fastpipe's own part" not in advice.summary
    assert "fastpipe's own part" in recommend("DecodeCrop", TRANSFORM, transform=list(stages)).summary
    namespace = run_snippet(advice)  # the uint8 recipe writes the absorbed crop and flip back as the user's transforms
    assert [type(t).__name__ for t in namespace["transform"].transforms] == ["RandomResizedCrop", "RandomHorizontalFlip", "PILToTensor"]
    val = [fastpipe.datasets.absorb(val_recipe).decode, *fastpipe.datasets.absorb(val_recipe).rest]
    namespace = run_snippet(recommend("Normalize", TRANSFORM, transform=val))
    assert [type(t).__name__ for t in namespace["transform"].transforms] == ["Resize", "CenterCrop", "PILToTensor"]
    assert namespace["transform"].transforms[0].size == 256 and list(namespace["transform"].transforms[1].size) == [224, 224]


def test_a_slow_custom_transform_gets_compile_or_move_to_the_device() -> None:
    advice = recommend("ConvertColor", TRANSFORM)
    assert "Numba" in advice.summary and "TORCH_LIBRARY" in advice.summary and "DevicePrefetcher" in advice.summary
    assert "ImageFolder" not in advice.summary


def test_a_merged_span_is_not_called_a_transform() -> None:
    advice = recommend("raw load + PILToTensor + collate/IPC", TRANSFORM, transform=IMAGENET)
    assert "measured as one span" in advice.summary and "fastpipe costs" in advice.summary
    assert "custom transform" not in advice.summary and "Numba" not in advice.summary
    assert "Decode only the crop" in advice.summary  # the raw load's own remedy is among the parts'


def test_the_drop_in_says_when_dct_scaling_cannot_help() -> None:
    small = recommend(RAW, RAW, transform=IMAGENET, image_size=(375, 500))
    assert "500x375" in small.caveat and "cannot help" in small.caveat and "448 px" in small.caveat
    assert recommend(RAW, RAW, transform=IMAGENET, image_size=(1200, 1600)).caveat is None
    assert "did not see your image sizes" in recommend(RAW, RAW, transform=IMAGENET).caveat
    resize = recommend("Resize", TRANSFORM, transform=T.Compose([T.Resize(256), T.CenterCrop(224)]), image_size=(375, 500))
    assert "cannot help" in resize.caveat and "512 px" in resize.caveat


def test_image_sizes_are_read_from_an_image_folder(image_root: Path) -> None:
    import torchvision

    dataset = torchvision.datasets.ImageFolder(str(image_root), transform=IMAGENET)
    advice = recommend(RAW, RAW, transform=IMAGENET, dataset=dataset)
    assert "500x375" in advice.caveat and "cannot help" in advice.caveat
    subset = torch.utils.data.Subset(dataset, [0, 1])  # a wrapper: the sizes are read through .dataset
    stages = list(IMAGENET.transforms)  # the stages as a list, as a diagnosis holds them
    assert "500x375" in recommend("RandomResizedCrop", TRANSFORM, transform=stages, dataset=subset).caveat


def test_raw_load_without_a_crop_says_the_drop_in_cannot_help() -> None:
    advice = recommend(RAW, RAW, transform=T.Compose([T.ToTensor()]))
    assert advice.snippet is None and "cannot help" in advice.caveat


def test_decode_and_crop_snippet_runs(image_root: Path) -> None:
    pytest.importorskip("fastpipe.datasets")
    import torchvision

    namespace = run_snippet(recommend("RandomResizedCrop", TRANSFORM, transform=IMAGENET), root=str(image_root), transform=IMAGENET)
    torch.manual_seed(3)
    image, label = namespace["dataset"][0]
    torch.manual_seed(3)
    expected, _ = torchvision.datasets.ImageFolder(str(image_root), transform=IMAGENET)[0]
    assert image.dtype == torch.float32 and tuple(image.shape) == (3, 224, 224) and label == 0
    assert ((image - expected).abs() * 255 * 0.226).mean().item() < 2.5  # the user's own output, in 0..255 levels


@pytest.mark.parametrize(
    "transform, shape",
    [
        (T.Compose([T.RandomCrop(64), T.ToTensor()]), (3, 64, 64)),
        (T.Compose([T.CenterCrop(64), T.ToTensor()]), (3, 64, 64)),
        (T.Compose([T.Resize(64), T.ToTensor()]), (3, 64, 85)),  # 375x500 -> shorter side 64
    ],
)
def test_box_loader_snippets_run(image_root: Path, transform: T.Compose, shape: tuple[int, ...]) -> None:
    crop = type(transform.transforms[0]).__name__
    advice = recommend(crop, TRANSFORM, transform=transform, image_size=(375, 500))
    namespace = run_snippet(advice, root=str(image_root), transform=transform)
    image, _ = namespace["dataset"][0]
    # RandomCrop gets a loader that returns the uint8 box; CenterCrop and Resize the zero-change class, whose
    # transform still ends with the user's ToTensor
    assert image.dtype == (torch.uint8 if crop == "RandomCrop" else torch.float32) and tuple(image.shape) == shape


def test_uint8_and_device_normalize_snippet_matches_torchvision() -> None:
    advice = recommend("Normalize", TRANSFORM, transform=IMAGENET)
    assert "PILToTensor" in advice.summary and "fastpipe.transforms.Normalize" in advice.summary
    namespace = run_snippet(advice)
    image = Image.fromarray(torch.randint(0, 256, (300, 400, 3), dtype=torch.uint8).numpy())
    torch.manual_seed(1)
    ours = namespace["normalize"](namespace["transform"](image)[None])[0]
    torch.manual_seed(1)
    theirs = IMAGENET(image)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_custom_transform_device_snippet_runs() -> None:
    loader = DataLoader([(torch.full((3, 4, 4), i, dtype=torch.uint8), i) for i in range(6)], batch_size=2)
    seen = []
    run_snippet(
        recommend("ConvertColor", TRANSFORM),
        loader=loader,
        device=torch.device("cpu"),
        convert_color=lambda images: images.flip(1),
        step=seen.append,
    )
    assert len(seen) == 3 and seen[0][0].shape == (2, 3, 4, 4)


def test_random_mask_gets_the_compiled_drop_in() -> None:
    from fastpipe.transforms import RandomMask

    advice = recommend("RandomMask", TRANSFORM)
    assert "fastpipe.transforms.RandomMask" in advice.summary and hasattr(RandomMask, "warm_up")
    compile(advice.snippet, "<mask>", "exec")
    # by the catalog's facts: the toy's naive mask has the drop-in; fastpipe's own is already compiled (more CPU, not
    # "compile it"); a user's class that only shares the name is their own code
    from fastpipe.workloads.toy.naive import RandomMask as NaiveMask

    assert "fastpipe.transforms.RandomMask is a compiled drop-in" in recommend("RandomMask", TRANSFORM, transform=[NaiveMask()]).summary
    ours = recommend("RandomMask", TRANSFORM, transform=T.Compose([RandomMask()])).summary
    assert ours.startswith("RandomMask: fastpipe's own part") and "Numba" not in ours

    class RandomMask:  # noqa: F811  (the user's own, named like fastpipe's)
        def __call__(self, image):  # type: ignore[no-untyped-def]
            return image

    assert recommend("RandomMask", TRANSFORM, transform=[RandomMask()]).summary.startswith("RandomMask: a custom")


def test_collate_snippet_runs_and_names_float_output(capsys: pytest.CaptureFixture[str]) -> None:
    advice = recommend(COLLATE, COLLATE, transform=IMAGENET)
    assert "uint8" in advice.summary and "ToTensor" in advice.caveat
    loader = DataLoader([(torch.zeros(3, 8, 8), 0)] * 4, batch_size=4)
    namespace = run_snippet(advice, loader=loader)
    assert "torch.float32 (4, 3, 8, 8)" in capsys.readouterr().out
    assert "fastpipe.loading.recycled(loader" in advice.summary
    images, labels = next(iter(namespace["loader"]))  # the recycled loader yields the same batches
    assert torch.equal(images, torch.zeros(4, 3, 8, 8)) and labels.tolist() == [0] * 4
    assert recommend(COLLATE, COLLATE, transform=T.Compose([T.PILToTensor()])).caveat is None


def test_copy_snippet_runs() -> None:
    advice = recommend(COPY, COPY)
    assert "pin_memory" in advice.summary and "non_blocking" in advice.summary and "DevicePrefetcher" in advice.summary
    seen = []
    run_snippet(advice, loader=DataLoader(torch.arange(8), batch_size=2), device=torch.device("cpu"), step=seen.append)
    assert [b.tolist() for b in seen] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_too_few_workers_points_at_tune() -> None:
    import fastpipe

    advice = recommend("raw load", WORKERS)
    assert "fastpipe tune SPEC" in advice.summary and callable(fastpipe.tune)
    compile(advice.snippet, "<tune>", "exec")


@pytest.mark.parametrize("make", ["DecodeCrop", "JpegRandomResizedCrop"])
def test_fastpipes_own_parts_get_workers_tune_or_device_decode_never_compile(make: str) -> None:
    import fastpipe.datasets as datasets
    import fastpipe.transforms.jpeg as jpeg

    stage = getattr(datasets, make, None) or getattr(jpeg, make)
    advice = recommend(make, TRANSFORM, transform=T.Compose([stage(224)]))
    assert "tune" in advice.summary and "device" in advice.summary and "workers" in advice.summary, advice.summary
    assert not any(word in advice.summary for word in COMPILED_KERNEL_WORDS), advice.summary
    # the user's own transform of the same name still gets the compile advice, and so do the toy's naive stages
    assert "Numba" in recommend(make, TRANSFORM).summary
    from fastpipe.workloads.toy.naive import naive_transform

    assert "Numba" in recommend("ConvertColor", TRANSFORM, transform=naive_transform()).summary


def test_a_jpeg_folder_read_by_fastpipes_image_folder_is_pointed_at_the_thread_loader_and_prepare(tmp_path: Path) -> None:
    """Collate/IPC or fastpipe's own decode dominating, on fastpipe's ImageFolder: the ThreadLoader; progressive files
    among the probed headers: ``fastpipe prepare``. Neither for torchvision's class or a baseline-only folder."""
    import torchvision

    from fastpipe.datasets import ImageFolder

    root = tmp_path / "mixed"
    (root / "a").mkdir(parents=True)
    pixels = np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8)
    for k in range(4):
        Image.fromarray(pixels).save(root / "a" / f"{k}.jpg", progressive=k < 2)
    ours = ImageFolder(root, transform=IMAGENET)
    collate = recommend(COLLATE, COLLATE, transform=IMAGENET, dataset=ours).summary
    assert "fastpipe.datasets.ThreadLoader" in collate
    decode = recommend("DecodeCrop", TRANSFORM, transform=list(ours.stages.transforms), dataset=ours).summary
    assert "fastpipe.datasets.ThreadLoader" in decode and "2 of 4 files probed are progressive" in decode
    assert "fastpipe prepare" in recommend(RAW, RAW, transform=IMAGENET, dataset=ours).summary
    theirs = torchvision.datasets.ImageFolder(str(root), transform=IMAGENET)
    assert "ThreadLoader" not in recommend(COLLATE, COLLATE, transform=IMAGENET, dataset=theirs).summary
    baseline = tmp_path / "baseline"
    (baseline / "a").mkdir(parents=True)
    Image.fromarray(pixels).save(baseline / "a" / "0.jpg")
    assert "fastpipe prepare" not in recommend(RAW, RAW, transform=IMAGENET, dataset=ImageFolder(baseline, transform=IMAGENET)).summary


def test_the_progressive_probe_reads_headers_only_and_never_a_file_descriptor(tmp_path: Path) -> None:
    """The probe reads a bounded prefix of each path (a 3 MB file whose frame header lies beyond it is not counted),
    skips samples that are not paths (an int would be taken by open() as a file descriptor and closed), and counts
    only JPEGs whose frame header it saw."""
    import os
    from types import SimpleNamespace

    from fastpipe.diagnosis.verdict._remedies._probes import HEADER_PROBE_BYTES, progressive

    pixels = np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "p.jpg", progressive=True)
    Image.fromarray(pixels).save(tmp_path / "b.jpg")
    Image.fromarray(pixels).save(tmp_path / "x.png")
    data = (tmp_path / "p.jpg").read_bytes()
    # a comment segment of 64 kB, repeated past the probe's prefix, before the frame header
    comment = b"\xff\xfe" + (65535).to_bytes(2, "big") + b"c" * 65533
    padded = data[:2] + comment * (HEADER_PROBE_BYTES // len(comment) + 2) + data[2:]
    (tmp_path / "late.jpg").write_bytes(padded)
    read, write = os.pipe()
    try:
        samples = [
            (read, 0),
            (str(tmp_path / "p.jpg"), 0),
            (tmp_path / "b.jpg", 0),
            (str(tmp_path / "x.png"), 0),
            (str(tmp_path / "late.jpg"), 0),
        ]
        assert progressive(SimpleNamespace(samples=samples)) == (1, 2)
        os.fstat(read)  # still open: raises OSError if the probe closed it
    finally:
        os.close(read)
        os.close(write)


def test_the_toys_raw_load_generates_images_so_no_decode_drop_in_is_advised() -> None:
    """The toy's FakeDataset makes its images with NumPy: no JPEG is decoded, so ImageFolder and DecodeCropLoader do not fit."""
    from fastpipe.workloads.toy.dataset import FakeDataset
    from fastpipe.workloads.toy.naive import naive_transform

    transform = naive_transform()
    dataset = FakeDataset(transform, length=8, raw_size=(64, 64))
    stages = list(transform.transforms)
    for stage, kind in ((RAW, RAW), ("RandomCrop", TRANSFORM)):
        advice = recommend(stage, kind, transform=stages, dataset=dataset)
        assert "FakeDataset generates each raw image" in advice.summary and "FastFakeDataset(crop_size=" in advice.summary
        assert "do not apply" in advice.summary and "ImageFolder(root" not in advice.summary and advice.snippet is None


# ----- what a stage is comes from the catalog's facts, never from its class name (issue 40, item 4) ------------------
class ToTensor:
    """The user's own ToTensor, named like torchvision's: a Python conversion fastpipe knows nothing about."""

    def __call__(self, image):  # type: ignore[no-untyped-def]
        return torch.as_tensor(np.array(image)).permute(2, 0, 1).float() / 255


class Shrink(T.RandomResizedCrop):
    """torchvision's RandomResizedCrop under the user's own name (a subclass that only sets its size)."""

    def __init__(self) -> None:
        super().__init__(224)


class ToFloat(T.ToTensor):
    """torchvision's ToTensor, renamed."""


def test_a_user_class_named_like_a_library_transform_is_advised_as_user_code() -> None:
    """A ``class ToTensor`` of the user's own is custom code: no uint8 recipe that assumes torchvision's scaling, no
    float caveat naming it; torchvision's ToTensor in the same place still gets the uint8 remedy."""
    mine = [T.RandomResizedCrop(224), ToTensor()]
    advice = recommend("ToTensor", TRANSFORM, transform=mine)
    assert advice.summary.startswith("ToTensor: a custom transform") and "Numba" in advice.summary, advice.summary
    assert "Ship uint8" not in advice.summary
    assert "Ship uint8" in recommend("ToTensor", TRANSFORM, transform=[T.RandomResizedCrop(224), T.ToTensor()]).summary
    assert recommend(COLLATE, COLLATE, transform=mine).caveat is None  # nothing says it makes float32
    assert "ToTensor" in recommend(COLLATE, COLLATE, transform=[T.RandomResizedCrop(224), T.ToTensor()]).caveat
    # the user's own code after a uint8 conversion: fastpipe no longer claims the batches are uint8 (the toy's Scale
    # makes floats of PILToTensor's uint8)
    from fastpipe.workloads.toy.naive import naive_transform

    assert ships_uint8([T.PILToTensor()]) is True and ships_uint8(naive_transform()) is None
    assert "uint8 payloads" in recommend(COPY, COPY, transform=naive_transform()).summary


def test_a_renamed_library_transform_is_advised_as_what_it_is() -> None:
    """torchvision's crop and ToTensor under the user's names get torchvision's remedies, and the uint8 recipe writes
    the renamed crop back as torchvision's class."""
    pipeline = [Shrink(), ToFloat(), T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]
    crop = recommend("Shrink", TRANSFORM, transform=pipeline)
    assert "Decode only the crop" in crop.summary and not any(word in crop.summary for word in COMPILED_KERNEL_WORDS), crop.summary
    floats = recommend("ToFloat", TRANSFORM, transform=pipeline)
    assert floats.summary.startswith("ToFloat: per-pixel float arithmetic") and "ToFloat + Normalize" in floats.summary, floats.summary
    assert "ToFloat" in recommend(COLLATE, COLLATE, transform=pipeline).caveat
    namespace = run_snippet(floats)
    assert [type(t).__name__ for t in namespace["transform"].transforms] == ["RandomResizedCrop", "PILToTensor"]
    assert list(namespace["transform"].transforms[0].size) == [224, 224]
    assert "Normalize(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))" in floats.snippet


def test_a_stage_known_by_name_alone_gets_the_catalogs_entry_of_that_name() -> None:
    """Without the pipeline, a name the catalog lists is that library's transform (already native: never "compile
    it"); a name it does not list is the user's own code."""
    jitter = recommend("ColorJitter", TRANSFORM)
    assert "already native code" in jitter.summary and "Numba" not in jitter.summary, jitter.summary
    assert "Numba" in recommend("MyJitter", TRANSFORM).summary
    # the stage is found by the name the report gives it: a repeated one by its count
    from fastpipe.diagnosis.verdict._remedies._pipeline import find

    twice = [T.PILToTensor(), T.Normalize((0.1,), (0.2,)), T.Normalize((0.3,), (0.4,))]
    assert find(twice, "Normalize")[0] is twice[1] and find(twice, "Normalize#2") == (twice[2], twice[:2])
