"""A user's training script, as it was before fastpipe: torchvision's ImageFolder and the classic ImageNet recipe.

fastpipe imports ``make_workload`` from here (``fastpipe diagnose train:make_workload``, run from this
folder): it returns the DataLoader and the training step, nothing else changes. Run the script itself
to train a few steps on the CPU: ``python train.py``.

The photos: set ``PHOTOS`` to your own ImageFolder; by default a small corpus of real photographs is
built once, locally, from the images scikit-image and scikit-learn ship (``pip install 'fastpipe[photos]'``).
"""

from __future__ import annotations

import os
import time

import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader

BATCH, WORKERS = 64, 2
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photos_root() -> str:
    root = os.environ.get("PHOTOS")
    if root:
        return root
    from fastpipe.workloads.photos import build_corpus

    return str(build_corpus(n=int(os.environ.get("PHOTOS_N", "600"))))


def make_model(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torchvision.models.resnet18(num_classes=10).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def make_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    criterion = torch.nn.CrossEntropyLoss()

    def step(batch) -> None:
        images, labels = batch
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def make_workload(device: torch.device):
    """What fastpipe needs: the loader and the step (``device`` is a torch.device to put the model on)."""
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(photos_root(), transform=transform)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, pin_memory=True)
    model, optimizer = make_model(device)
    return loader, make_step(model, optimizer)


if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader, step = make_workload(device)
    started = time.perf_counter()
    for i, (images, labels) in enumerate(loader):
        step((images.to(device, non_blocking=True), labels.to(device, non_blocking=True)))
        if i == 4:
            break
    print(f"5 steps of {BATCH} in {time.perf_counter() - started:.1f} s on {device}")
