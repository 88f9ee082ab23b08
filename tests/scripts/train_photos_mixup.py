"""A training script in the style of torchvision's classification reference (references/classification/train.py),
small: an ImageFolder of photos under a ``ClassificationPresetTrain``-style preset (RandomResizedCrop, flip,
PILToTensor, ConvertImageDtype, Normalize in ``self.transforms``), a RandomSampler, ``pin_memory=True``, and, with
``--mixup-alpha``, the reference's mixup in the DataLoader's ``collate_fn`` (``lambda batch:
mixup(*default_collate(batch))``). ``--step-ms`` waits in each step as a loop waits for its GPU. Nothing in it
knows fastpipe.
"""

import argparse
import time

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.utils.data.dataloader import default_collate

parser = argparse.ArgumentParser(description="torchvision-reference-style training over a photo folder (small)")
parser.add_argument("--data-path", required=True)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("-j", "--workers", default=0, type=int)
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("--crop", default=32, type=int)
parser.add_argument("--mixup-alpha", default=0.0, type=float)
parser.add_argument("--step-ms", default=0.0, type=float)


class ClassificationPresetTrain:
    def __init__(self, crop_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.transforms = T.Compose(
            [
                T.RandomResizedCrop(crop_size, antialias=True),
                T.RandomHorizontalFlip(0.5),
                T.PILToTensor(),
                T.ConvertImageDtype(torch.float),
                T.Normalize(mean=mean, std=std),
            ]
        )

    def __call__(self, img):
        return self.transforms(img)


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(0)
    dataset = torchvision.datasets.ImageFolder(args.data_path, ClassificationPresetTrain(args.crop))
    num_classes = len(dataset.classes)
    collate_fn = None
    if args.mixup_alpha > 0:
        from torchvision.transforms import v2

        mixup = v2.MixUp(alpha=args.mixup_alpha, num_classes=num_classes)
        collate_fn = lambda batch: mixup(*default_collate(batch))  # noqa: E731
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=torch.utils.data.RandomSampler(dataset),
        num_workers=args.workers,
        pin_memory=True,
        collate_fn=collate_fn,
    )
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        for images, target in loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
        print(f"epoch {epoch} done, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
