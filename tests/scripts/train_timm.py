"""A training script in the style of timm's ``train.py``, small: its loader is ``timm.data.create_loader`` with the
prefetcher on (timm's default; ``--no-prefetcher`` turns it off), so the script iterates a ``PrefetchLoader``
that moves each batch to ``--device`` and normalizes it there (on the CPU timm runs it without a side stream).

The planted slow stage: ``SlowFilter`` sleeps ``--slow-ms`` per sample, put at the head of the transform
``create_loader`` gave the dataset, as a user adds a step to timm's transforms. Nothing in it knows fastpipe.
"""

import argparse
import time

import timm
import timm.data
import timm.optim
import timm.scheduler
import torch
import torchvision.datasets as datasets
from planted import SlowFilter

parser = argparse.ArgumentParser(description="timm-style training (small, with a planted slow stage)")
parser.add_argument("--model", default="test_resnet")
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("--lr", default=0.05, type=float)
parser.add_argument("--samples", default=4000, type=int)
parser.add_argument("--img-size", default=32, type=int)
parser.add_argument("--slow-ms", default=4.0, type=float)
parser.add_argument("--no-prefetcher", action="store_true", default=False)
parser.add_argument("--device", default="cpu")
parser.add_argument("--log-interval", default=50, type=int)
parser.add_argument("--seed", default=42, type=int)


def main() -> None:
    args = parser.parse_args()
    args.prefetcher = not args.no_prefetcher
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = timm.create_model(args.model, pretrained=False, num_classes=10).to(device)
    data_config = timm.data.resolve_data_config(vars(args), model=model)
    dataset_train = datasets.FakeData(args.samples, (3, 40, 40), 10)
    loader_train = timm.data.create_loader(
        dataset_train,
        input_size=(3, args.img_size, args.img_size),
        batch_size=args.batch_size,
        is_training=True,
        use_prefetcher=args.prefetcher,
        mean=data_config["mean"],
        std=data_config["std"],
        num_workers=args.workers,
        device=device,
    )
    timm_transform = dataset_train.transform
    dataset_train.transform = type(timm_transform)([SlowFilter(args.slow_ms), *timm_transform.transforms])
    optimizer = timm.optim.create_optimizer_v2(model, opt="sgd", lr=args.lr, momentum=0.9)
    scheduler, _ = timm.scheduler.create_scheduler_v2(optimizer, sched="cosine", num_epochs=args.epochs)
    loss_fn = torch.nn.CrossEntropyLoss().to(device)
    print(f"loader: {type(loader_train).__name__}", flush=True)
    for epoch in range(args.epochs):
        train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args, device)
        scheduler.step(epoch + 1)
    print("done", flush=True)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, device) -> None:
    model.train()
    end = time.time()
    for batch_idx, (input, target) in enumerate(loader):
        if not args.prefetcher:
            input, target = input.to(device), target.to(device)
        loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train: {epoch} [{batch_idx}/{len(loader)}] Loss: {loss.item():.3f} Time: {time.time() - end:.3f}s", flush=True)
        end = time.time()


if __name__ == "__main__":
    main()
