"""The same script after the two drop-ins ``fastpipe diagnose train:make_workload`` recommended.

1. RandomResizedCrop on a PIL image (the raw load decodes the whole JPEG, the crop throws most of it
   away) -> ``fastpipe.datasets.ImageFolder``: decode only the crop, resize and flip in one C++ pass,
   uint8 out. Same folder layout, classes and labels as torchvision's ImageFolder; the crop boxes are
   drawn with torchvision's own RandomResizedCrop.get_params.
2. ToTensor + Normalize in the workers (float32: 4x the bytes through shared memory and the copy) ->
   uint8 through the loader and ``fastpipe.transforms.Normalize`` on the device, on whole batches.
   It equals ToTensor + Normalize to within 1e-6.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from train import BATCH, MEAN, STD, WORKERS, make_model, make_step, photos_root

import fastpipe
from fastpipe.datasets import ImageFolder
from fastpipe.transforms import Normalize


def make_workload(device: torch.device) -> fastpipe.Workload:
    dataset = ImageFolder(photos_root(), size=224, hflip=0.5)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, pin_memory=True)
    model, optimizer = make_model(device)
    return fastpipe.Workload(
        loader=loader,
        step=make_step(model, optimizer),
        device_transform=Normalize(MEAN, STD),
        model=model,
        optimizer=optimizer,
        prefetch_depth=2,
        name="train_fast",
    )


if __name__ == "__main__":
    import time

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workload = make_workload(device)
    started = time.perf_counter()
    for i, batch in enumerate(fastpipe.DevicePrefetcher(workload.loader, device, transform=workload.device_transform)):
        workload.step(batch)
        if i == 4:
            break
    print(f"5 steps of {BATCH} in {time.perf_counter() - started:.1f} s on {device}")
