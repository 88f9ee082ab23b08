"""A small training script in the style of torchvision's classification reference (``references/classification/
train.py``): ``load_data`` returns the datasets and samplers, ``main`` builds the DataLoader with ``collate_fn`` (mixup
with ``--mixup-alpha``, else None), and ``train_one_epoch`` iterates it through a logger's generator and copies each
batch with ``image, target = image.to(device), target.to(device)``. Nothing in it knows fastpipe; the patch tests copy
it (with ``patch_presets.py``) to a temporary folder. ``--steps N`` stops after N steps, printing one line each."""

import argparse
import os

import patch_presets as presets
import torch
import torch.utils.data
import torchvision
from torch import nn
from torch.utils.data.dataloader import default_collate


def log_every(iterable, header):
    for i, obj in enumerate(iterable):
        yield obj


def train_one_epoch(model, criterion, optimizer, data_loader, device, args):
    model.train()
    for i, (image, target) in enumerate(log_every(data_loader, "Epoch")):
        image, target = image.to(device), target.to(device)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {i} loss {loss.item():.4f} input {tuple(image.shape)} {image.dtype} mean {image.float().mean():.3f}", flush=True)
        if i + 1 >= args.steps:
            break


def load_data(traindir, args):
    cache_path = os.path.join(traindir, "cache.pt")
    if args.cache_dataset and os.path.exists(cache_path):
        dataset, _ = torch.load(cache_path)
    else:
        dataset = torchvision.datasets.ImageFolder(
            traindir,
            presets.ClassificationPresetTrain(crop_size=args.crop),
        )
    train_sampler = torch.utils.data.RandomSampler(dataset)
    return dataset, train_sampler


def mix(images, target, alpha):
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    return images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam)), target


def main(args):
    device = torch.device(args.device)
    dataset, train_sampler = load_data(os.path.join(args.data_path, "train"), args)
    collate_fn = None
    if args.mixup_alpha > 0.0:
        collate_fn = lambda batch: mix(*default_collate(batch), args.mixup_alpha)  # noqa: E731
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=False,
        collate_fn=collate_fn,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, len(dataset.classes))
    )
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, device, args)


def get_args_parser():
    parser = argparse.ArgumentParser(description="torchvision-reference-style training (small)")
    parser.add_argument("--data-path", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("-b", "--batch-size", default=4, type=int)
    parser.add_argument("-j", "--workers", default=1, type=int)
    parser.add_argument("--epochs", default=1, type=int)
    parser.add_argument("--steps", default=3, type=int)
    parser.add_argument("--crop", default=32, type=int)
    parser.add_argument("--mixup-alpha", default=0.0, type=float)
    parser.add_argument("--cache-dataset", action="store_true")
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
