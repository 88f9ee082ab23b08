"""A WebDataset training stream of real photos, with one slow stage planted: fastpipe names it.

Run from this folder: ``fastpipe diagnose wds_train:make_workload --device sim:40``. The shards are written
once, next to the photos, from a small corpus of real photographs (``pip install 'fastpipe[photos]'``;
set ``PHOTOS`` to use your own ImageFolder). The chain is the usual one: read the shards, decode, crop, a
planted ``slow_augment`` (a wait of ``SLOW_MS`` per sample, as a remote call or a slow disk would be), the
tensor conversion, and batching inside the pipeline. fastpipe caches after each of them, in each worker.
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import torch
import torchvision.transforms.v2 as T
from PIL import Image
from torch.utils.data import DataLoader

BATCH, WORKERS, SHARDS = 4, 2, 4
SLOW_MS = float(os.environ.get("SLOW_MS", "40"))
SIDE = 160  # photos are stored small, so decoding them is cheap next to the planted stage


def photos_root() -> Path:
    root = os.environ.get("PHOTOS")
    if root:
        return Path(root)
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(n=int(os.environ.get("PHOTOS_N", "32")), classes=4)


def write_shards(photos: Path, out: Path, shards: int = SHARDS, side: int = SIDE) -> list[str]:
    """The photos as WebDataset tar shards (``jpg`` and ``cls`` per sample), written once."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    files = sorted(photos.rglob("*.jpg"))
    classes = sorted({f.parent.name for f in files})
    urls = [str(out / f"shard-{i:03d}.tar") for i in range(shards)]
    if all(Path(u).exists() for u in urls):
        return urls
    for i, url in enumerate(urls):
        with wds.TarWriter(url + ".part") as sink:
            for f in files[i::shards]:
                image = Image.open(f).convert("RGB")
                image.thumbnail((side, side))
                data = io.BytesIO()
                image.save(data, format="JPEG", quality=90)
                sink.write({"__key__": f"{f.parent.name}_{f.stem}", "jpg": data.getvalue(), "cls": classes.index(f.parent.name)})
        os.replace(url + ".part", url)
    return urls


CROP = T.RandomResizedCrop(128, antialias=True)


def crop(sample: dict) -> dict:
    return {**sample, "jpg": CROP(sample["jpg"])}


def slow_augment(sample: dict) -> dict:
    time.sleep(SLOW_MS / 1000)  # the planted cost
    return sample


def to_tensor(sample: dict) -> dict:
    return {**sample, "jpg": T.functional.pil_to_tensor(sample["jpg"])}


def make_stream(urls: list[str]):
    import webdataset as wds

    return (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode("pil")
        .map(crop)
        .map(slow_augment)
        .map(to_tensor)
        .batched(BATCH)
        .with_epoch(10_000)  # batches per worker and epoch: a long epoch, as in training
    )


def make_workload(device: torch.device):
    """(loader, step) for fastpipe: the stream in a DataLoader that batches nothing itself (the chain does)."""
    photos = photos_root()
    urls = write_shards(photos, photos.parent / f"{photos.name}-shards")
    loader = DataLoader(make_stream(urls), batch_size=None, num_workers=WORKERS)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(4)).to(device)

    def step(batch: dict) -> None:
        images = batch["jpg"].to(device).float() / 255
        model(images).sum().backward()

    return loader, step


if __name__ == "__main__":
    loader, step = make_workload(torch.device("cpu"))
    for i, batch in enumerate(loader):
        step(batch)
        if i == 9:
            break
    print("ten steps on", batch["jpg"].shape)
