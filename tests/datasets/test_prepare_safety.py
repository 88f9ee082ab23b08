"""``prepare`` never damages what the user trains on: the source untouched, the copy lists what the source lists.

Each test is one item of issue 33 (the number in its docstring); all fail on the code before that issue's fix.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets import ImageFolder

import fastpipe.ops.jpeg as jpeg
from fastpipe.cli import main
from fastpipe.datasets.prepare import prepare_folder, to_baseline
from fastpipe.errors import ConfigError

requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


def _jpeg(seed: int, progressive: bool = True, side: int = 32) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=80, progressive=progressive)
    return buf.getvalue()


def _folder(root: Path, classes: dict[str, int], seed: int = 0) -> Path:
    for k, (name, count) in enumerate(classes.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / name / f"{i}.jpg").write_bytes(_jpeg(seed + 100 * k + i, progressive=i % 2 == 0))
    return root


def _listing(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    folder = ImageFolder(str(root))
    return folder.classes, [(os.path.relpath(path, root), label) for path, label in folder.samples]


def test_target_inside_the_source_is_refused_and_the_source_unchanged(tmp_path: Path) -> None:
    """Item 1: prepare SRC SRC/prepared wrote a new class of duplicates into SRC."""
    source = _folder(tmp_path / "src", {"a": 2, "b": 2, "c": 2})
    before = _listing(source)
    with pytest.raises(ConfigError, match="inside the source"):
        prepare_folder(source, source / "prepared", measure=False)
    with pytest.raises(ConfigError, match="inside the source"):
        prepare_folder(source, source / "a" / "deeper" / "prepared", measure=False)
    with pytest.raises(ConfigError, match="source .* is inside the target"):
        prepare_folder(source, tmp_path, measure=False)
    assert _listing(source) == before and sorted(p.name for p in source.iterdir()) == ["a", "b", "c"]


def test_target_inside_a_folder_the_source_links_to_is_refused(tmp_path: Path) -> None:
    """Item 1, through a symlinked class folder: the target would still appear among the source's classes."""
    elsewhere = _folder(tmp_path / "elsewhere", {"b": 2})
    source = _folder(tmp_path / "src", {"a": 2})
    (source / "b").symlink_to(elsewhere / "b", target_is_directory=True)
    with pytest.raises(ConfigError, match="through a symlinked folder"):
        prepare_folder(source, elsewhere / "b" / "prepared", measure=False)
    assert not (elsewhere / "b" / "prepared").exists()


def test_cli_refuses_a_nested_target_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 1 from the command line: exit 2, one line, nothing written."""
    source = _folder(tmp_path / "src", {"a": 1, "b": 1})
    assert main(["prepare", str(source), str(source / "prepared"), "--no-measure"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastpipe: error: prepare: the target") and "\n" not in err
    assert not (source / "prepared").exists() and not (source / ".prepared.fastpipe-partial").exists()


@requires_op
def test_symlinked_class_folders_are_copied_as_imagefolder_lists_them(tmp_path: Path) -> None:
    """Item 2: a symlinked class folder was dropped (2 classes became 1, every later label shifted)."""
    elsewhere = _folder(tmp_path / "elsewhere", {"a_linked": 3})
    source = _folder(tmp_path / "src", {"b": 3, "c": 2})
    (source / "a_linked").symlink_to(elsewhere / "a_linked", target_is_directory=True)
    report = prepare_folder(source, tmp_path / "dst", measure=False)
    assert _listing(tmp_path / "dst") == _listing(source)
    assert _listing(tmp_path / "dst")[0] == ["a_linked", "b", "c"] and report.files == 8
    assert not (tmp_path / "dst" / "a_linked").is_symlink()


def test_a_symlink_loop_is_an_error_not_a_hang(tmp_path: Path) -> None:
    """Item 2's walk follows folder links, as torchvision does; a loop is named instead of walked forever."""
    source = _folder(tmp_path / "src", {"a": 1})
    (source / "a" / "back").symlink_to(source, target_is_directory=True)
    with pytest.raises(ConfigError, match="loop"):
        prepare_folder(source, tmp_path / "dst", measure=False)


@requires_op
def test_a_listing_that_differs_fails_loudly_and_leaves_no_target(tmp_path: Path) -> None:
    """Item 2's final check: a copy that ImageFolder lists differently is never renamed into the target."""
    from fastpipe.datasets._prepare_tree import check_same_listing

    source = _folder(tmp_path / "src", {"a": 2, "b": 2})
    copy = _folder(tmp_path / "copy", {"a": 2})
    with pytest.raises(ConfigError, match="classes differ"):
        check_same_listing(source, copy, tmp_path / "dst")
    (copy / "b").mkdir()
    (copy / "b" / "0.jpg").write_bytes(b"x")
    with pytest.raises(ConfigError, match="lists 3 files where the source lists 4"):
        check_same_listing(source, copy, tmp_path / "dst")


@pytest.mark.parametrize("rows", [-3, 65536, 1.5, True])
def test_bad_restart_rows_is_an_error_before_any_file(tmp_path: Path, rows: object) -> None:
    """Item 4: --restart-rows -3 was taken as a damaged file, so every progressive file was linked unchanged, exit 0."""
    source = _folder(tmp_path / "src", {"a": 2})
    with pytest.raises(ConfigError, match="restart_rows"):
        prepare_folder(source, tmp_path / "dst", restart_rows=rows)  # type: ignore[arg-type]
    assert not (tmp_path / "dst").exists() and not (tmp_path / ".dst.fastpipe-partial").exists()
    with pytest.raises(ConfigError, match="restart_rows"):
        to_baseline(torch.frombuffer(bytearray(_jpeg(1)), dtype=torch.uint8), restart_rows=rows)  # type: ignore[arg-type]


def test_cli_bad_restart_rows_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 4 from the command line."""
    source = _folder(tmp_path / "src", {"a": 2})
    assert main(["prepare", str(source), str(tmp_path / "dst"), "--restart-rows", "-3"]) == 2
    assert "restart_rows must be" in capsys.readouterr().err and not (tmp_path / "dst").exists()


@requires_op
def test_a_file_that_fails_to_rewrite_is_named_counted_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 4: a progressive file that cannot be rewritten is counted as failed, by name, and the exit status says so."""
    source = _folder(tmp_path / "src", {"a": 2})
    (source / "a" / "broken.jpg").write_bytes(_jpeg(7)[:200])
    assert main(["prepare", str(source), str(tmp_path / "dst"), "--no-measure"]) == 1
    captured = capsys.readouterr()
    assert "1 failed to rewrite" in captured.out and "a/broken.jpg" in captured.err
    assert (tmp_path / "dst" / "a" / "broken.jpg").read_bytes() == (source / "a" / "broken.jpg").read_bytes()  # kept as it is
    assert _listing(tmp_path / "dst") == _listing(source)


@requires_op
def test_symlinked_files_are_copied_by_content_never_as_links(tmp_path: Path) -> None:
    """Item 5: a relative symlink was copied as a link, dangling in a target at another depth."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "rel.jpg").write_bytes(_jpeg(3, progressive=False))
    (store / "abs.jpg").write_bytes(_jpeg(4, progressive=False))
    (store / "prog.jpg").write_bytes(_jpeg(5, progressive=True))
    source = _folder(tmp_path / "src", {"a": 1})
    (source / "a" / "rel.jpg").symlink_to(os.path.relpath(store / "rel.jpg", source / "a"))
    (source / "a" / "abs.jpg").symlink_to(store / "abs.jpg")
    (source / "a" / "prog.jpg").symlink_to(os.path.relpath(store / "prog.jpg", source / "a"))
    target = tmp_path / "deep" / "er" / "dst"
    prepare_folder(source, target, measure=False)
    for name in ("rel.jpg", "abs.jpg", "prog.jpg"):
        out = target / "a" / name
        assert not out.is_symlink() and out.is_file(), name
    assert (target / "a" / "rel.jpg").read_bytes() == (store / "rel.jpg").read_bytes()
    assert not jpeg.is_progressive(jpeg.read_bytes(target / "a" / "prog.jpg"))
    assert all(ImageFolder(str(target))[i][0].size == (32, 32) for i in range(4))  # every file loads
    (store / "abs.jpg").unlink()  # the original gone: the copy still holds the content
    assert (target / "a" / "abs.jpg").stat().st_size > 0


@requires_op
def test_an_interrupted_run_leaves_no_target_and_the_same_call_resumes(tmp_path: Path) -> None:
    """Item 6: after Ctrl-C the target looked complete (ImageFolder loaded 1 of 2 classes) and a rerun was refused."""
    source = _folder(tmp_path / "src", {"a": 4, "b": 4})
    target = tmp_path / "dst"

    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_folder(source, target, measure=False, progress=stop_after_three)
    assert not target.exists()
    with pytest.raises(FileNotFoundError):
        ImageFolder(str(target))
    with pytest.raises(ConfigError, match=r"rm -r .*\.dst\.fastpipe-partial"):
        prepare_folder(source, target, restart_rows=2, measure=False)  # another preparation: says what to delete
    report = prepare_folder(source, target, measure=False)
    assert report.resumed == 3 and report.changed + report.linked + report.copied == 5
    assert _listing(target) == _listing(source) and not (tmp_path / ".dst.fastpipe-partial").exists()
    assert not list(target.rglob(".fastpipe-*")), "no marker left in the target"


def test_cli_interrupt_says_how_to_resume(tmp_path: Path) -> None:
    """Item 6 from the command line, with a real SIGINT: exit 130, no target, the partial folder named."""
    import signal
    import subprocess
    import sys
    import time

    source = _folder(tmp_path / "src", {f"c{k}": 40 for k in range(10)})
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastpipe", "prepare", str(source), str(tmp_path / "dst"), "--no-measure"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    partial = tmp_path / ".dst.fastpipe-partial"
    deadline = time.monotonic() + 60
    started = lambda: any(partial.glob("c0/*.jpg")) or any((tmp_path / "dst").glob("c0/*.jpg"))  # noqa: E731
    while time.monotonic() < deadline and proc.poll() is None and not started():
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == 130, err
    assert "was not made" in err and str(partial) in err and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("case", ["file", "under_a_file", "too_long"])
def test_bad_targets_are_one_line_errors(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 10: a target that is a file, lies under a file, or cannot be created gave a traceback."""
    source = _folder(tmp_path / "src", {"a": 1})
    (tmp_path / "afile").write_text("mine")
    target = {"file": tmp_path / "afile", "under_a_file": tmp_path / "afile" / "dst", "too_long": tmp_path / ("x" * 300) / "dst"}[case]
    assert main(["prepare", str(source), str(target), "--no-measure"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastpipe: error: prepare: the target") and "\n" not in err, err
    assert (tmp_path / "afile").read_text() == "mine"
