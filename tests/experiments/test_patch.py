"""The patch writer: a candidate fix as a unified diff of the script's own files (``experiments/_patch``), from the
creation sites recorded while the script ran (``experiments/_sites``).

The scripts (``tests/scripts/patch_*.py``, in the styles of torchvision's classification reference, pytorch/examples'
``imagenet/main.py``, and a loader built inside a function) are copied to a temporary folder with a small image
folder; each runs in this process until its loader has given two batches, the candidates are built from its live
loader, and each patch is checked: it applies with ``patch -p0 --dry-run`` from the script's folder, and the patched
copy runs (a subprocess, a few steps) with what the fix changed and every argument the loader call had.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastpipe.experiments._fix_candidates import Candidate, build_candidates
from fastpipe.experiments._patch import Patch, _apply, _Edit, write_patch
from fastpipe.experiments._patch_script import run_until_loader
from fastpipe.experiments._sites import CallSite, copy_in_loop, follow_argument
from fastpipe.experiments._source import SourceFile
from fastpipe.loading._rebuild import rebuild_loader
from fastpipe.workloads._workload import Workload

SCRIPTS = Path(__file__).parents[1] / "scripts"
ROOT = Path(__file__).resolve().parents[2]
PATCH = shutil.which("patch")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 24 small JPEGs in two classes (``<root>/train/class_k``)."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for label in range(2):
        folder = root / "train" / f"class_{label}"
        folder.mkdir(parents=True)
        for index in range(12):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"{index}.jpg", quality=90)
    return root


def _copy(tmp_path: Path, *names: str) -> Path:
    for name in names:
        shutil.copy(SCRIPTS / name, tmp_path / name)
    return tmp_path


def _patches(folder: Path, script: str, args: list[str]) -> tuple[Workload, dict[str, tuple[Candidate, Patch]]]:
    recorder, loader = run_until_loader("path", str(folder / script), args, batches=2)
    assert loader is not None
    original = Workload(loader=loader, step=lambda batch: None)
    candidates, _ = build_candidates(original)
    sites = recorder.sites(loader)
    return original, {c.name: (c, write_patch(folder / script, original, c, sites)) for c in candidates}


def _find(patches: dict[str, tuple[Candidate, Patch]], *words: str) -> Patch:
    matches = [patch for name, (_, patch) in patches.items() if name.startswith(words[0]) and all(w in name for w in words)]
    assert len(matches) == 1, (words, list(patches))
    return matches[0]


def _apply_patch(folder: Path, diff: str, dry_run: bool = False) -> str:
    if PATCH is None:
        pytest.skip("no `patch` program on this machine")
    done = subprocess.run(
        [PATCH, "-p0", *(["--dry-run"] if dry_run else [])], input=diff, text=True, capture_output=True, cwd=folder, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _run(folder: Path, script: str, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, script, *args], cwd=folder, env=env, text=True, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_tv_style_decode_and_uint8_patch_applies_and_runs(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_tv_train.py", "patch_presets.py")
    args = ["--data-path", str(images), "--workers", "0"]
    _, patches = _patches(folder, "patch_tv_train.py", args)
    patch = _find(patches, "decode only the crop", "and uint8")
    assert patch.diff is not None and not patch.unplaced and patch.refused is None
    checked = _apply_patch(folder, patch.diff, dry_run=True)
    assert "checking file patch_presets.py" in checked and "checking file patch_tv_train.py" in checked
    _apply_patch(folder, patch.diff)
    train = (folder / "patch_tv_train.py").read_text()
    presets = (folder / "patch_presets.py").read_text()
    assert "fastpipe.datasets.ImageFolder(" in train and "presets.ClassificationPresetTrain(crop_size=args.crop).transforms" in train
    assert "collate_fn=collate_fn," in train and "sampler=train_sampler," in train  # the loader call is untouched
    assert "image = device_normalize(image)" in train and "import fastpipe" in train
    train_preset = presets.split("class ClassificationPresetEval")[0]
    assert "ConvertImageDtype" not in train_preset and "Normalize" not in train_preset
    assert presets.split("class ClassificationPresetEval")[1].count("Normalize") == 1  # the eval preset keeps its own


def test_tv_style_thread_loader_is_refused_for_its_collate_fn(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_tv_train.py", "patch_presets.py")
    _, patches = _patches(folder, "patch_tv_train.py", ["--data-path", str(images), "--workers", "0"])
    patch = _find(patches, "ThreadLoader")
    if patch.refused is None:  # a ThreadLoader that takes a collate_fn keeps it
        assert patch.diff is not None and "collate_fn=collate_fn" in patch.diff.split("ThreadLoader(")[-1]
        return
    assert patch.diff is None and "collate_fn=collate_fn" in patch.refused and "mixup" in patch.refused
    assert "refused:" in patch.text()


def test_uint8_patch_refused_when_collate_fn_mixes(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_tv_train.py", "patch_presets.py")
    _, patches = _patches(folder, "patch_tv_train.py", ["--data-path", str(images), "--workers", "0", "--mixup-alpha", "0.2"])
    patch = _find(patches, "uint8 over the copy")
    if patch.diff is None and patch.refused is None:  # the candidate itself may be refused by fix for this collate_fn
        return
    assert patch.refused is not None and "collate_fn" in patch.refused and patch.diff is None


def test_examples_main_to_tensor_becomes_pil_to_tensor(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_examples_main.py")
    _, patches = _patches(folder, "patch_examples_main.py", [str(images), "--workers", "0"])
    patch = _find(patches, "uint8 over the copy")
    assert patch.diff is not None and not patch.unplaced
    _apply_patch(folder, patch.diff)
    text = (folder / "patch_examples_main.py").read_text()
    compose = text.split("transforms.Compose(")[1].split("]")[0]
    assert "PILToTensor()" in compose and "ToTensor()" not in compose.replace("PILToTensor()", "") and "normalize" not in compose
    assert "images = device_normalize(images)" in text


def test_examples_main_thread_loader_keeps_every_argument(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_examples_main.py")
    _, patches = _patches(folder, "patch_examples_main.py", [str(images), "--workers", "1"])
    patch = _find(patches, "ThreadLoader")
    assert patch.diff is not None and patch.refused is None, patch.text()
    _apply_patch(folder, patch.diff)
    text = (folder / "patch_examples_main.py").read_text()
    call = text.split("fastpipe.datasets.ThreadLoader(")[1].split("train(train_loader")[0]
    for kept in ("batch_size=args.batch_size", "shuffle=(train_sampler is None)", "sampler=train_sampler", "pin_memory=True"):
        assert kept in call
    assert "threads=args.workers" in call and "num_workers" not in call


def test_loader_built_in_a_function(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_in_function.py")
    args = [str(images / "train"), "--workers", "1"]
    _, patches = _patches(folder, "patch_in_function.py", args)
    patch = _find(patches, "ThreadLoader")
    assert patch.diff is not None, patch.text()
    assert any("persistent_workers=workers > 0 dropped" in note for note in patch.notes)
    _apply_patch(folder, patch.diff, dry_run=True)
    _apply_patch(folder, patch.diff)
    text = (folder / "patch_in_function.py").read_text()
    assert "return fastpipe.datasets.ThreadLoader(train_set, batch_size, shuffle=True, threads=workers, drop_last=True)" in text
    assert "fastpipe.datasets.ImageFolder(root, transform=train_transform)" in text


def test_dataset_built_in_another_file(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_split_main.py", "patch_data.py")
    _, patches = _patches(folder, "patch_split_main.py", [str(images / "train")])
    patch = _find(patches, "decode only the crop", "and uint8")
    assert patch.diff is not None and not patch.unplaced, patch.text()
    _apply_patch(folder, patch.diff)
    data = (folder / "patch_data.py").read_text()
    assert "fastpipe.datasets.ImageFolder(\n        root, transform=transforms.Compose(" in data and "import fastpipe.datasets" in data
    assert "transforms.PILToTensor()]" in data and "normalize]" not in data
    assert "inputs = device_normalize(inputs)" in (folder / "patch_split_main.py").read_text()


def test_recycled_and_settings_edit_the_loader_call(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_tv_train.py", "patch_presets.py")
    args = ["--data-path", str(images), "--workers", "1"]
    recorder, loader = run_until_loader("path", str(folder / "patch_tv_train.py"), args)
    original = Workload(loader=loader, step=lambda batch: None)
    sites = recorder.sites(loader)
    settings = Candidate(
        "num_workers 1 -> 2",
        ("workers",),
        "DataLoader(..., num_workers=2)",
        workload=dataclasses.replace(original, loader=rebuild_loader(loader, loader.dataset, num_workers=2, prefetch_factor=4)),
    )
    patch = write_patch(folder / "patch_tv_train.py", original, settings, sites)
    assert patch.diff is not None
    assert "-        num_workers=args.workers,\n+        num_workers=2,\n" in patch.diff
    assert "+        prefetch_factor=4," in patch.diff and "collate_fn=collate_fn" in patch.diff
    _apply_patch(folder, patch.diff, dry_run=True)
    recycled = _find({c.name: (c, write_patch(folder, original, c, sites)) for c in build_candidates(original)[0]}, "recycled")
    assert recycled.diff is not None and "fastpipe.loading.recycled(torch.utils.data.DataLoader(" in recycled.diff
    _apply_patch(folder, recycled.diff, dry_run=True)


def test_advice_only_candidate_gives_its_code(tmp_path: Path) -> None:
    advice = Candidate("compile MyBlur", ("MyBlur",), "rewrite MyBlur.__call__ as a compiled kernel", not_tried="your own code")
    patch = write_patch(tmp_path / "train.py", None, advice, None)  # type: ignore[arg-type]
    assert patch.diff is None and patch.snippet == advice.code and "your own code" in patch.unplaced[0]


def _source(tmp_path: Path, text: str) -> SourceFile:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(text))
    return SourceFile.read(path)


def test_copy_in_loop_names_the_images(tmp_path: Path) -> None:
    source = _source(
        tmp_path,
        """
        for step, (x, y) in enumerate(loader):
            print(step)
            x, y = x.to(device, non_blocking=True), y.to(device)
            model(x)
        for batch in loader:
            images = batch[0].cuda()
        for batch in loader:
            model(batch.to(device))
        """,
    )
    loops = [n for n in source.tree.body if isinstance(n, ast.For)]
    first, second, third = (copy_in_loop(source, loop) for loop in loops)
    assert first is not None and first.images == "x" and first.statement.lineno == 4
    assert second is not None and second.images == "images"
    assert third is None  # a copy inside a call: no statement to put Normalize after


def test_follow_argument_through_a_returned_tuple(tmp_path: Path) -> None:
    source = _source(
        tmp_path,
        """
        def load(root):
            dataset = torch.load(root)
            dataset = ImageFolder(root, T())
            return dataset, None

        def main():
            train, _ = load("x")
            loader = DataLoader(train, batch_size=4)
            other = DataLoader(make_dataset(), batch_size=4)
        """,
    )
    calls = [n for n in ast.walk(source.tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "DataLoader"]
    found, why = follow_argument(CallSite(source, calls[0], "test"), "dataset", 0, ("ImageFolder",), None)
    assert found is not None and found.call.lineno == 4, why
    missing, why = follow_argument(CallSite(source, calls[1], "test"), "dataset", 0, ("ImageFolder",), None)
    assert missing is None and "make_dataset" in why and "factory" in why


def test_neighbouring_removals_merge(tmp_path: Path) -> None:
    text = "a, b, c, d"
    edits = [_Edit(tmp_path, 3, 6, ""), _Edit(tmp_path, 4, 9, "")]
    assert _apply(text, edits) == "a, d"
    with pytest.raises(ValueError):
        _apply(text, [_Edit(tmp_path, 3, 6, "x"), _Edit(tmp_path, 4, 9, "")])


RUNS = [
    (
        "tv-decode-uint8",
        ("patch_tv_train.py", "patch_presets.py"),
        ["--data-path", "{images}", "--workers", "0"],
        ("decode only the crop", "and uint8"),
        "torch.float32",
    ),
    (
        "tv-recycled",
        ("patch_tv_train.py", "patch_presets.py"),
        ["--data-path", "{images}", "--workers", "1"],
        ("recycled",),
        "torch.float32",
    ),
    ("examples-uint8", ("patch_examples_main.py",), ["{images}", "--workers", "0"], ("uint8 over the copy",), "torch.float32"),
    ("examples-threads", ("patch_examples_main.py",), ["{images}", "--workers", "1"], ("ThreadLoader",), "torch.float32"),
    ("function-threads", ("patch_in_function.py",), ["{images}/train", "--workers", "1"], ("ThreadLoader",), "torch.float32"),
    (
        "split-decode-uint8",
        ("patch_split_main.py", "patch_data.py"),
        ["{images}/train"],
        ("decode only the crop", "and uint8"),
        "torch.float32",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("files, args, words, dtype", [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_patched_script_runs(
    tmp_path: Path, images: Path, files: tuple[str, ...], args: list[str], words: tuple[str, ...], dtype: str
) -> None:
    """Each patch applied to its copy of the script, and the patched script trains two steps (a subprocess)."""
    folder = _copy(tmp_path, *files)
    args = [a.format(images=images) for a in args]
    _, patches = _patches(folder, files[0], args)
    patch = _find(patches, *words)
    assert patch.diff is not None and patch.refused is None, patch.text()
    _apply_patch(folder, patch.diff)
    out = _run(folder, files[0], [*args, "--steps", "2"])
    assert "step 1" in out and dtype in out


def _writer(tmp_path: Path, text: str) -> tuple[SourceFile, Patch, Any]:
    from fastpipe.experiments._patch import _Writer
    from fastpipe.experiments._sites import Sites

    source = _source(tmp_path, text)
    patch = Patch("test")
    return source, patch, _Writer(patch, Sites(tmp_path.resolve()))


def test_removing_a_blocks_only_append_leaves_pass(tmp_path: Path) -> None:
    source, patch, writer = _writer(
        tmp_path,
        """
        trans = [Crop()]
        if use_float:
            trans.append(ConvertImageDtype(torch.float))
        trans.append(Normalize(mean, std))
        """,
    )
    from fastpipe.experiments._patch import _removable

    for name in ("ConvertImageDtype", "Normalize"):
        call = next(n for n in ast.walk(source.tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == name)
        writer.remove(source, *_removable(source, call))
    writer.finish()
    assert patch.diff is not None and not patch.unplaced
    assert "-    trans.append(ConvertImageDtype(torch.float))\n" in patch.diff and "+    pass\n" in patch.diff
    assert "-trans.append(Normalize(mean, std))\n" in patch.diff and patch.diff.count("\n+") == 2  # +++ and the pass


def test_a_statement_sharing_its_line_is_not_removed(tmp_path: Path) -> None:
    from fastpipe.experiments._patch import _removable, _Unplaceable

    source, _, writer = _writer(tmp_path, "if p: trans.append(Normalize(m, s))\n")
    call = next(n for n in ast.walk(source.tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Normalize")
    with pytest.raises(_Unplaceable):
        writer.remove(source, *_removable(source, call))


def test_an_edit_that_would_not_parse_is_left_out(tmp_path: Path) -> None:
    source, patch, writer = _writer(tmp_path, "x = f(1, 2)\n")
    writer.replace(source, 4, 5, "f((")  # a broken edit: the diff must not carry it
    writer.finish()
    assert patch.diff is None and "would not parse" in patch.unplaced[0]


def test_normalize_goes_after_a_conditional_copy_not_inside_it(tmp_path: Path) -> None:
    from fastpipe.experiments._patch import Patch, _normalize_edits, _Writer
    from fastpipe.experiments._sites import Sites
    from fastpipe.transforms.device import Normalize

    source = _source(
        tmp_path,
        """
        def train(loader, model, args):
            for i, (images, target) in enumerate(loader):
                if args.gpu is not None:
                    images = images.cuda(args.gpu, non_blocking=True)
                output = model(images)
        """,
    )
    loop = next(n for n in ast.walk(source.tree) if isinstance(n, ast.For))
    sites = Sites(tmp_path.resolve(), copy=copy_in_loop(source, loop))
    patch = Patch("test")
    writer = _Writer(patch, sites)
    original = Workload(loader=None, step=lambda b: None)  # type: ignore[arg-type]
    _normalize_edits(writer, original, dataclasses.replace(original, device_transform=Normalize((0.5,) * 3, (0.25,) * 3)))
    writer.finish()
    assert patch.diff is not None
    assert "             images = images.cuda(args.gpu, non_blocking=True)\n+        images = device_normalize(images)\n" in patch.diff


def test_a_setting_passed_by_position_is_replaced_in_place(tmp_path: Path, images: Path) -> None:
    folder = _copy(tmp_path, "patch_in_function.py")
    recorder, loader = run_until_loader("path", str(folder / "patch_in_function.py"), [str(images / "train"), "--workers", "0"])
    original = Workload(loader=loader, step=lambda batch: None)
    bigger = Candidate(
        "batch_size 4 -> 8", (), "", workload=dataclasses.replace(original, loader=rebuild_loader(loader, loader.dataset, batch_size=8))
    )
    patch = write_patch(folder / "patch_in_function.py", original, bigger, recorder.sites(loader))
    assert patch.diff is not None and "DataLoader(train_set, 8, shuffle=True" in patch.diff and "batch_size=8" not in patch.diff


def test_patch_for_report_takes_the_best_then_the_first_recommended(tmp_path: Path, images: Path) -> None:
    from fastpipe.experiments._fix import NOT_HELPING, RECOMMENDED, FixReport, FixResult
    from fastpipe.experiments._patch import patch_for_report

    folder = _copy(tmp_path, "patch_in_function.py")
    recorder, loader = run_until_loader("path", str(folder / "patch_in_function.py"), [str(images / "train"), "--workers", "1"])
    original = Workload(loader=loader, step=lambda batch: None)
    candidates = [c for c in build_candidates(original)[0] if c.workload is not None]
    assert len(candidates) >= 2 and all(c.original is original for c in candidates)
    results = [FixResult(c.name, RECOMMENDED, c.code, [], candidate=c) for c in candidates]
    report = FixReport("patch_in_function.py", "cpu", None, 10.0, 0.01, results=results, best=candidates[1].name)
    assert patch_for_report(folder, report, recorder).fix == candidates[1].name  # type: ignore[union-attr]
    report.best = None
    assert patch_for_report(folder, report, recorder).fix == candidates[0].name  # type: ignore[union-attr]
    for result in results:  # nothing recommended: no patch
        result.status = NOT_HELPING
    assert patch_for_report(folder, report, recorder) is None


def test_a_loop_without_a_copy_gets_normalize_first_in_its_body_and_runs(tmp_path: Path, images: Path) -> None:
    # a script that trains on the CPU copies no batch: the Normalize the fix moves goes first in the loop's body, on the
    # batch the header unpacks, where fastpipe measured it (before the script's step)
    folder = _copy(tmp_path, "train_photos_mixup.py")
    args = ["--data-path", str(images / "train"), "-b", "4", "--crop", "16"]
    _, patches = _patches(folder, "train_photos_mixup.py", args)
    patch = _find(patches, "uint8 over the copy")
    assert patch.diff is not None and not patch.unplaced and patch.withheld is None, patch.text()
    assert "         for images, target in loader:\n+            images = device_normalize(images)\n" in patch.diff
    assert "-                T.Normalize(mean=mean, std=std),\n" in patch.diff
    _apply_patch(folder, patch.diff)
    assert "epoch 0 done" in _run(folder, "train_photos_mixup.py", args)


def test_a_fix_whose_normalize_has_no_place_writes_no_diff(tmp_path: Path, images: Path) -> None:
    # `for batch in loader:` unpacks nothing in its header and copies nothing: the Normalize taken out of the transform
    # would have no place to go back, so the placed edits are withheld rather than handed out as a script that trains
    # on uint8 images
    text = (SCRIPTS / "train_photos_mixup.py").read_text()
    old = "        for images, target in loader:\n"
    assert old in text
    (tmp_path / "batch_loop.py").write_text(text.replace(old, "        for batch in loader:\n            images, target = batch\n"))
    _, patches = _patches(tmp_path, "batch_loop.py", ["--data-path", str(images / "train"), "-b", "4", "--crop", "16"])
    patch = _find(patches, "uint8 over the copy")
    assert patch.diff is None and patch.withheld is not None and "unnormalized uint8" in patch.withheld
    assert "not unpack the batch" in patch.unplaced[0] and "no diff: the fix takes Normalize out" in patch.text()
    assert "fastpipe.Normalize(mean=" in patch.snippet


def test_a_loader_made_in_a_librarys_factory_is_not_rewritten_and_the_snippet_is_given(tmp_path: Path, images: Path) -> None:
    # as timm's train.py gets its loader from timm.data.create_loader: the DataLoader call is not in the user's files,
    # so a fix of the loader is not placed; the patch says where the loader came from and gives the change as code
    library, folder = tmp_path / "lib", tmp_path / "script"
    library.mkdir()
    folder.mkdir()
    (library / "loaderlib.py").write_text(
        textwrap.dedent(
            """
            import torch, torchvision
            import torchvision.transforms as T

            def create_loader(root, batch_size, workers):
                dataset = torchvision.datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(16), T.PILToTensor()]))
                return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=True)
            """
        )
    )
    (folder / "train.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(library)!r})
            import loaderlib

            loader = loaderlib.create_loader(sys.argv[1], 4, 0)
            for epoch in range(2):
                for images, target in loader:
                    pass
            """
        )
    )
    recorder, loader = run_until_loader("path", str(folder / "train.py"), [str(images / "train")])
    assert loader is not None
    original = Workload(loader=loader, step=lambda batch: None)
    more = Candidate(
        "num_workers 0 -> 1",
        (),
        "DataLoader(..., num_workers=1)",
        workload=dataclasses.replace(original, loader=rebuild_loader(loader, loader.dataset, num_workers=1)),
    )
    patch = write_patch(folder / "train.py", original, more, recorder.sites(loader))
    assert patch.diff is None and patch.snippet, patch.text()
    assert any("create_loader(...)" in why and "does not rewrite a factory" in why for why in patch.unplaced), patch.unplaced
