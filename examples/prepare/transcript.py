"""``fastpipe prepare`` on the folders that used to damage it: a transcript to rerun (issue 33's "must show").

The source has a symlinked class folder and a relative symlinked file; the run tries a target nested in the source,
is interrupted with a real SIGINT, and is run again. At the end ``torchvision.datasets.ImageFolder`` lists the
source and the target, which must show the same classes and files.

    python examples/prepare/transcript.py [WORKDIR]     # default: a new temporary folder

Every line after ``$`` is the command as a user would type it (``fastpipe`` is ``python -m fastpipe`` here).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

FILES_PER_CLASS = 150


def _jpeg(seed: int, progressive: bool) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:96, 0:128]
    base = np.stack([x * 1.5, y * 2.0, 128 + 90 * np.sin(x / 7.0)], axis=-1) + rng.normal(0, 12, (96, 128, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=85, progressive=progressive)
    return buf.getvalue()


def build(root: Path) -> Path:
    """src/dogs (real), src/cats -> ../store/cats (a symlinked class folder), src/dogs/shared.jpg -> a relative link."""
    for folder, seed in ((root / "store" / "cats", 0), (root / "src" / "dogs", 1000)):
        folder.mkdir(parents=True)
        for i in range(FILES_PER_CLASS):
            (folder / f"{i:03d}.jpg").write_bytes(_jpeg(seed + i, progressive=i % 2 == 0))
    (root / "store" / "shared.jpg").write_bytes(_jpeg(5000, progressive=True))
    (root / "src" / "cats").symlink_to(Path("..") / "store" / "cats", target_is_directory=True)
    (root / "src" / "dogs" / "shared.jpg").symlink_to(Path("..") / ".." / "store" / "shared.jpg")
    return root / "src"


def fastpipe(*args: str, interrupt_when: Path | None = None) -> int:
    """Run ``python -m fastpipe ARGS`` and print what it prints; SIGINT it once ``interrupt_when`` holds a file."""
    print("$ fastpipe " + " ".join(args), flush=True)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-m", "fastpipe", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if interrupt_when is not None:
        while proc.poll() is None and not any(interrupt_when.glob("*/*.jpg")):
            time.sleep(0.002)
        if proc.poll() is None:
            done = sum(1 for _ in interrupt_when.glob("*/*.jpg"))
            proc.send_signal(signal.SIGINT)
            print(f"  [Ctrl-C sent after {done} files were in place]")
    out, _ = proc.communicate()
    for line in out.strip().splitlines():
        print("  " + line)
    print(f"  [exit status {proc.returncode}]")
    return proc.returncode


def listing(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    from torchvision.datasets import ImageFolder

    folder = ImageFolder(str(root))
    return folder.classes, [(os.path.relpath(path, root), label) for path, label in folder.samples]


def main() -> int:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="fastpipe-prepare-"))
    source = build(work)
    print(f"in {work}: src/cats -> {os.readlink(source / 'cats')}, src/dogs/shared.jpg -> {os.readlink(source / 'dogs' / 'shared.jpg')}")
    before = listing(source)
    print(f"ImageFolder(src): classes {before[0]}, {len(before[1])} files\n")

    print("1. a target inside the source")
    fastpipe("prepare", str(source), str(source / "prepared"))
    print(f"  src still holds {sorted(p.name for p in source.iterdir())}\n")

    target = work / "out" / "deep" / "dst"
    partial = target.parent / f".{target.name}.fastpipe-partial"
    print("2. interrupted")
    fastpipe("prepare", str(source), str(target), interrupt_when=partial)
    try:
        listing(target)
        print("  ImageFolder(dst) loads: WRONG")
    except FileNotFoundError as exc:
        print(f"  ImageFolder(dst): FileNotFoundError ({exc.strerror or exc}): nothing half-made to train on\n")

    print("3. the same command again")
    code = fastpipe("prepare", str(source), str(target))
    after = listing(target)
    print(f"\nImageFolder(src): classes {before[0]}, {len(before[1])} files")
    print(f"ImageFolder(dst): classes {after[0]}, {len(after[1])} files")
    same = after == before
    print(f"same classes, files and labels: {same}")
    shared = target / "dogs" / "shared.jpg"
    print(f"dst/dogs/shared.jpg is a symlink: {shared.is_symlink()}; dst/cats is a symlink: {(target / 'cats').is_symlink()}")
    from torchvision.datasets import ImageFolder

    loaded = sum(1 for image, _ in ImageFolder(str(target)) if image.size == (128, 96))
    print(f"every file of dst loads: {loaded} of {len(after[1])}")
    print(f"partial folder left: {partial.exists()}")
    return 0 if same and code == 0 and loaded == len(after[1]) else 1


if __name__ == "__main__":
    sys.exit(main())
