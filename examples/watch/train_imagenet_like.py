"""A training script shaped like PyTorch's official ImageNet example (pytorch/examples imagenet/main.py), small.

It builds its own DataLoader (ImageFolder-style transforms: RandomResizedCrop, RandomHorizontalFlip, ToTensor,
Normalize) over the JPEGs in ``--data``'s ``train/`` folder, as the official example does, or over ``--dummy``-style
FakeData without it, and trains with SGD in a plain loop. Nothing in it knows fastpipe. Try:

    python examples/watch/train_imagenet_like.py --epochs 1
    fastpipe watch -- python examples/watch/train_imagenet_like.py --epochs 1
"""

import argparse
import os
import time

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="PyTorch ImageNet-like training (small)")
parser.add_argument("--data", default=None, help="a folder whose train/ holds class folders of images (FakeData if not given)")
parser.add_argument("-a", "--arch", default="tiny", help="a torchvision model name, or tiny (default)")
parser.add_argument("-j", "--workers", default=2, type=int, help="data loading workers")
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("-b", "--batch-size", default=16, type=int)
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--samples", default=256, type=int, help="FakeData images (the official --dummy uses 1,281,167)")
parser.add_argument("--image-size", default=64, type=int, help="FakeData image side before the crop")
parser.add_argument("--crop", default=32, type=int)
parser.add_argument("--print-freq", default=10, type=int)


def tiny(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes)
    )


def main() -> None:
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    num_classes = 10
    model = tiny(num_classes) if args.arch == "tiny" else models.__dict__[args.arch](num_classes=num_classes)
    model = model.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.crop),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    if args.data:
        train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transform)
    else:
        train_dataset = datasets.FakeData(args.samples, (3, args.image_size, args.image_size), num_classes, transform)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=torch.cuda.is_available()
    )

    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        for i, (images, target) in enumerate(train_loader):
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % args.print_freq == 0:
                print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\tTime {time.time() - end:.3f}\tLoss {loss.item():.4f}")
            end = time.time()


if __name__ == "__main__":
    main()
