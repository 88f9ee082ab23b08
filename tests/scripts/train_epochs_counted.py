"""A small training script that schedules by ``len(loader)`` and checks its own epochs, as real scripts rely on them.

Each epoch it counts its batches and asserts that every batch index is below ``len(train_loader)`` and that the
epoch held exactly ``len(train_loader)`` batches (what the sampler and ``drop_last`` give); after each epoch it runs a
validation pass. Its schedules are the kinds that break when an epoch runs long:

* ``--onecycle``: ``OneCycleLR(total_steps=epochs * len(loader))``, stepped every batch (it raises ``ValueError``
  past its total steps);
* ``--accum K``: timm's ``train.py`` gradient accumulation arithmetic (the last ``len(loader) % K`` batches of an
  epoch accumulate fewer; a batch index past the epoch gives ``accum_steps == 0`` and a modulo by zero).

``--crash-at N`` raises at global step N; ``--save-on-exit PATH`` saves the model's and the optimizer's
``state_dict()`` in a ``finally:`` however the script ends; ``--trace PATH`` saves the model's and the optimizer's state
before each step (with its global step) so a test can compare what was saved on exit with the weights at any step.
``--iterable`` reads the same data from an IterableDataset without ``__len__`` (no epoch length to keep).
Nothing in it knows fastpipe.
"""

import argparse
import copy
import time
import warnings

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="a loop that checks its own epochs")
parser.add_argument("--samples", default=100, type=int)
parser.add_argument("--val-samples", default=16, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--drop-last", action="store_true")
parser.add_argument("--onecycle", action="store_true")
parser.add_argument("--accum", default=1, type=int, help="gradient accumulation steps, timm's arithmetic")
parser.add_argument("--step-ms", default=0.0, type=float, help="wait this long in each step, as a loop waits for its GPU")
parser.add_argument(
    "--sample-ms", default=0.0, type=float, help="wait this long for each sample, as a slow disk makes the loop input-bound"
)
parser.add_argument("--iterable", action="store_true", help="an IterableDataset without __len__")
parser.add_argument("--crash-at", default=None, type=int)
parser.add_argument("--save-on-exit", default=None)
parser.add_argument("--trace", default=None, help="save the model's state before every step here (a list)")
parser.add_argument("--seed", default=0, type=int)


class Wait:
    """Waits ``ms`` for each sample and returns it unchanged: loading that holds up the loop on any machine."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, sample):
        time.sleep(self.ms / 1000)
        return sample


class Stream(torch.utils.data.IterableDataset):
    """The same samples, streamed (no ``__len__``), split among the workers."""

    def __init__(self, dataset: torch.utils.data.Dataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, len(self.dataset), step):
            yield self.dataset[i]


def make_loader(args, samples: int, train: bool) -> torch.utils.data.DataLoader:
    normalize = transforms.Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    crop = transforms.RandomResizedCrop(16) if train else transforms.CenterCrop(16)
    steps = [crop, transforms.ToTensor(), normalize] + ([Wait(args.sample_ms)] if train and args.sample_ms else [])
    dataset = datasets.FakeData(samples, (3, 20, 20), 10, transforms.Compose(steps), random_offset=int(not train))
    if train and args.iterable:
        return torch.utils.data.DataLoader(Stream(dataset), batch_size=args.batch_size, num_workers=args.workers)
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=train, num_workers=args.workers, drop_last=train and args.drop_last
    )


def main() -> None:
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "Detected call of")  # accumulation skips optimizer steps
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9)
    loader, val_loader = make_loader(args, args.samples, True), make_loader(args, args.val_samples, False)
    length = None if args.iterable else len(loader)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=args.epochs * length) if args.onecycle else None
    progress = {"step": 0, "trace": []}
    try:
        for epoch in range(args.epochs):
            count = train_one_epoch(epoch, model, loader, optimizer, scheduler, args, progress)
            assert length is None or count == length, f"epoch {epoch} held {count} batches, len(loader) is {length}"
            print(f"epoch {epoch}: {count} batches of {length}", flush=True)
            validate(model, val_loader)
        print(f"trained {progress['step']} steps", flush=True)
    finally:
        if args.save_on_exit:
            torch.save({"step": progress["step"], "model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.save_on_exit)
        if args.trace:
            torch.save(progress["trace"], args.trace)


def train_one_epoch(epoch, model, loader, optimizer, scheduler, args, progress) -> int:
    """timm's loop shape: accumulation steps worked out from the batches left in the epoch."""
    model.train()
    criterion = nn.CrossEntropyLoss()
    count = 0
    if not args.iterable:
        accum_steps = args.accum
        last_accum_steps = len(loader) % accum_steps
        last_batch_idx = len(loader) - 1
        last_batch_idx_to_accum = len(loader) - last_accum_steps
    for batch_idx, (images, target) in enumerate(loader):
        count += 1
        if not args.iterable:
            assert batch_idx <= last_batch_idx, f"epoch {epoch}: batch index {batch_idx} past the epoch's {len(loader)} batches"
            last_batch = batch_idx == last_batch_idx
            need_update = last_batch or (batch_idx + 1) % accum_steps == 0
            if batch_idx >= last_batch_idx_to_accum:
                accum_steps = last_accum_steps
            need_update = need_update or (batch_idx + 1) % accum_steps == 0  # timm's: a modulo by zero past the epoch
        else:
            need_update = True
        if args.trace:
            model_state = {k: v.clone() for k, v in model.state_dict().items()}
            progress["trace"].append((progress["step"], model_state, copy.deepcopy(optimizer.state_dict())))
        loss = criterion(model(images), target) / max(1, args.accum)
        loss.backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
        progress["step"] += 1
        if args.crash_at is not None and progress["step"] >= args.crash_at:
            raise RuntimeError(f"planted crash at step {progress['step']}")
    return count


def validate(model, val_loader) -> None:
    model.eval()
    with torch.no_grad():
        for images, _ in val_loader:
            model(images)
    model.train()


if __name__ == "__main__":
    main()
