"""A small script in the style of pytorch/examples' ``imagenet/main.py``: a module-level ``normalize`` used inside the
Compose, ``ToTensor`` before it, ``train_loader`` built in ``main_worker``, and ``train`` copying with
``images = images.to(device, non_blocking=True)``. Nothing in it knows fastpipe. ``--steps N`` stops after N steps."""

import argparse
import os

import torch
import torch.nn as nn
import torch.utils.data
import torchvision.datasets as datasets
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="PyTorch ImageNet-example-style training (small)")
parser.add_argument("data", metavar="DIR")
parser.add_argument("-j", "--workers", default=1, type=int)
parser.add_argument("-b", "--batch-size", default=4, type=int)
parser.add_argument("--steps", default=3, type=int)
parser.add_argument("--crop", default=32, type=int)


def main():
    args = parser.parse_args()
    main_worker(args)


def main_worker(args):
    device = torch.device("cpu")
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2)).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
    traindir = os.path.join(args.data, "train")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(
        traindir,
        transforms.Compose(
            [
                transforms.RandomResizedCrop(args.crop),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    train_sampler = None
    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=(train_sampler is None),
        num_workers=args.workers,
        pin_memory=True,
        sampler=train_sampler,
    )
    train(train_loader, model, criterion, optimizer, device, args)


def train(train_loader, model, criterion, optimizer, device, args):
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {i} loss {loss.item():.4f} input {tuple(images.shape)} {images.dtype} mean {images.float().mean():.3f}", flush=True)
        if i + 1 >= args.steps:
            break


if __name__ == "__main__":
    main()
