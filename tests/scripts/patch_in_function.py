"""A small script that builds its loader inside a function (``make_loader``) from a transform assigned to a name,
and trains in a module-level loop with ``x = x.cuda()``-style copies written as ``.to(DEVICE)``. Nothing in it knows
fastpipe. ``--steps N`` stops after N steps."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

DEVICE = torch.device("cpu")


def make_loader(root, batch_size, workers, crop):
    train_transform = transforms.Compose(
        [transforms.RandomResizedCrop(crop), transforms.PILToTensor(), transforms.ConvertImageDtype(torch.float32)]
    )
    train_set = datasets.ImageFolder(root, transform=train_transform)
    return DataLoader(train_set, batch_size, shuffle=True, num_workers=workers, drop_last=True, persistent_workers=workers > 0)


parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("--workers", default=1, type=int)
parser.add_argument("--steps", default=3, type=int)
args = parser.parse_args()

loader = make_loader(args.root, 4, args.workers, 32)
model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    x = x.to(DEVICE)
    y = y.to(DEVICE)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f} input {tuple(x.shape)} {x.dtype}", flush=True)
    if step + 1 >= args.steps:
        break
