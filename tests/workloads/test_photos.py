"""The real-photo JPEG corpus: deterministic, ImageNet-like sizes, every JPEG flavour, cached, clear errors."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torchvision
from PIL import Image, JpegImagePlugin

from fastpipe.errors import ConfigError, OptionalDependencyError
from fastpipe.workloads.photos import BUILDING_MARKER, MARKER, build_corpus, default_root

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
pytest.importorskip("sklearn", reason="the corpus needs scikit-learn: pip install 'fastpipe[photos]'")

N = 40


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=N, seed=3)


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.jpg"))}


def test_imagefolder_layout_of_ten_classes(corpus: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(corpus)
    assert dataset.classes == [f"class_{k}" for k in range(10)]
    assert len(dataset) == N
    assert sorted(dataset.targets) == sorted(k for k in range(10) for _ in range(N // 10))
    assert json.loads((corpus / MARKER).read_text())["n"] == N


def test_sizes_follow_imagenet(corpus: Path) -> None:
    sizes = [Image.open(p).size for p in corpus.rglob("*.jpg")]
    shorter = [min(s) for s in sizes]
    assert min(shorter) >= 300 and max(shorter) <= 500
    assert any(w > h for w, h in sizes) and any(w < h for w, h in sizes)  # landscape and portrait
    assert sum(max(s) == 500 for s in sizes) >= N // 3  # ImageNet's commonest long side dominates
    assert len(set(sizes)) >= 5


def test_every_flavour_is_present(corpus: Path) -> None:
    images = [Image.open(p) for p in sorted(corpus.rglob("*.jpg"))]
    modes = [im.mode for im in images]
    assert modes.count("CMYK") == 1
    assert 1 <= modes.count("L") <= N // 10
    assert modes.count("RGB") >= N * 8 // 10
    assert 1 <= sum(bool(im.info.get("progressive")) for im in images) < N // 2
    assert all(im.format == "JPEG" for im in images)
    samplings = {JpegImagePlugin.get_sampling(im) for im in images if im.mode == "RGB"}
    assert 2 in samplings and len(samplings) >= 2  # 4:2:0 mostly, and others
    for im in images:
        im.load()  # every file decodes fully


def test_deterministic_by_seed(corpus: Path, tmp_path: Path) -> None:
    again = build_corpus(tmp_path / "again", n=N, seed=3, workers=2)  # built in two processes: same bytes
    assert digests(again) == digests(corpus)
    other = build_corpus(tmp_path / "other", n=N, seed=4)
    assert digests(other).keys() == digests(corpus).keys()
    assert sum(a != b for a, b in zip(digests(other).values(), digests(corpus).values())) == N


def test_a_complete_build_is_reused_and_an_interrupted_one_redone(tmp_path: Path) -> None:
    root = build_corpus(tmp_path / "c", n=20, seed=0)
    first = sorted(root.rglob("*.jpg"))[0]
    first.write_bytes(b"changed")  # a reused corpus is not rewritten
    assert build_corpus(root, n=20, seed=0) == root and first.read_bytes() == b"changed"
    (root / MARKER).rename(root / BUILDING_MARKER)  # what an interrupted build leaves: no completion marker
    build_corpus(root, n=20, seed=0)
    assert first.read_bytes()[:3] == b"\xff\xd8\xff" and (root / MARKER).exists() and not (root / BUILDING_MARKER).exists()


def test_default_root_is_in_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_root(2000, 0) == tmp_path / "fastpipe" / "photos-2000-0"
    root = build_corpus(n=12, seed=1, classes=3)
    assert root == tmp_path / "fastpipe" / "photos-12-1-c3" and len(list(root.rglob("*.jpg"))) == 12


def test_bad_roots_and_sizes_are_clear_errors(tmp_path: Path) -> None:
    build_corpus(tmp_path / "c", n=20, seed=0)
    with pytest.raises(ConfigError, match="different fastpipe corpus"):
        build_corpus(tmp_path / "c", n=30, seed=0)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a fastpipe corpus"):
        build_corpus(tmp_path / "mine", n=20)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="no class folder is empty"):
        build_corpus(tmp_path / "small", n=5, classes=10)


def test_missing_photo_packages_say_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "skimage", None)
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(OptionalDependencyError, match=r"pip install 'fastpipe\[photos\]'"):
        build_corpus(tmp_path / "c", n=10)


def test_verbose_builds_say_so_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_corpus(tmp_path / "c", n=10, classes=2, verbose=True)
    assert "building the real-photo JPEG corpus (10 files)" in capsys.readouterr().err
    build_corpus(tmp_path / "c", n=10, classes=2, verbose=True)
    assert capsys.readouterr().err == ""  # reused: nothing to say
