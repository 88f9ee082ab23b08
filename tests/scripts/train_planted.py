"""A training script written like PyTorch's official ImageNet example (pytorch/examples imagenet/main.py), small,
with a planted slow stage: ``SlowFilter`` sleeps ``--slow-ms`` per sample inside the dataset's transforms.

Nothing in it knows fastpipe. It has its own argparse, model, loss, SGD with a StepLR schedule, a plain loop with
its own logging and a checkpoint written at the end of each epoch. Flags for the failure modes the tests plant:
``--loop-ms MS`` burns CPU on each batch before the model (the loop's own work), ``--crash-at N`` raises at global
step N, ``--exit-at N`` calls ``sys.exit(message)`` there, ``--stop-at N`` breaks out of training there (the loop
ends early), ``--no-train`` never iterates a loader. ``--val-samples N`` adds a validation loader (no planted
stage), evaluated after each epoch as the example does, and before training too with ``--validate-first`` (a
baseline accuracy, as a resumed run checks its checkpoint).
"""

import argparse
import sys
import time

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from planted import SlowFilter

parser = argparse.ArgumentParser(description="PyTorch ImageNet-like training (small, with a planted slow stage)")
parser.add_argument("-j", "--workers", default=2, type=int, help="data loading workers")
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("--lr", default=0.05, type=float)
parser.add_argument("--samples", default=4000, type=int, help="FakeData images")
parser.add_argument("--image-size", default=40, type=int)
parser.add_argument("--crop", default=32, type=int)
parser.add_argument("--slow-ms", default=4.0, type=float, help="the planted stage's sleep per sample")
parser.add_argument("--step-ms", default=0.0, type=float, help="wait this long in each step, as a loop waits for its GPU")
parser.add_argument("--loop-ms", default=0.0, type=float, help="the loop's own CPU work on each batch before its model (ms)")
parser.add_argument("--print-freq", default=50, type=int)
parser.add_argument("--checkpoint", default=None, help="write the model's state here at the end of each epoch")
parser.add_argument("--crash-at", default=None, type=int)
parser.add_argument("--exit-at", default=None, type=int)
parser.add_argument("--stop-at", default=None, type=int)
parser.add_argument("--interrupt-at", default=None, type=int, help="raise KeyboardInterrupt there, as Ctrl-C in a step does")
parser.add_argument("--spawn", action="store_true", help="start the loader's workers with multiprocessing spawn")
parser.add_argument("--no-train", action="store_true")
parser.add_argument("--val-samples", default=0, type=int, help="a validation loader over this many images, after each epoch")
parser.add_argument("--validate-first", action="store_true", help="evaluate on the validation loader before training")
parser.add_argument("--seed", default=0, type=int)
parser.add_argument("--save-on-exit", default=None, help="however the script ends, write its model's state and step count here")


def per_batch_work(images: torch.Tensor, ms: float) -> torch.Tensor:
    """The loop's own work on a batch before its model (a per-batch transform in Python, say): ``ms`` of CPU."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass
    return images


def tiny(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes)
    )


def make_loader(args: argparse.Namespace) -> torch.utils.data.DataLoader:
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.FakeData(
        args.samples,
        (3, args.image_size, args.image_size),
        10,
        transforms.Compose([transforms.RandomResizedCrop(args.crop), SlowFilter(args.slow_ms), transforms.ToTensor(), normalize]),
    )
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=torch.cuda.is_available(),
        multiprocessing_context="spawn" if args.spawn and args.workers else None,
    )


def make_val_loader(args: argparse.Namespace) -> torch.utils.data.DataLoader:
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.FakeData(
        args.val_samples,
        (3, args.image_size, args.image_size),
        10,
        transforms.Compose([transforms.CenterCrop(args.crop), transforms.ToTensor(), normalize]),
        random_offset=1,
    )
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.workers)


def validate(val_loader, model, criterion, device) -> float:
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for images, target in val_loader:
            output = model(images.to(device))
            correct += int((output.argmax(1) == target.to(device)).sum())
            seen += len(target)
    model.train()
    acc = 100.0 * correct / max(1, seen)
    print(f" * Acc@1 {acc:.3f}", flush=True)
    return acc


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = tiny(10).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    train_loader = make_loader(args)
    if args.no_train:
        print("nothing to train", flush=True)
        return
    val_loader = make_val_loader(args) if args.val_samples else None
    if val_loader is not None and args.validate_first:
        validate(val_loader, model, criterion, device)
    progress = {"step": 0}
    try:
        train(args, model, criterion, optimizer, scheduler, train_loader, device, progress, val_loader)
    finally:
        if args.save_on_exit:
            torch.save({"step": progress["step"], "state_dict": model.state_dict()}, args.save_on_exit)


def train(args, model, criterion, optimizer, scheduler, train_loader, device, progress, val_loader=None) -> None:
    step = 0
    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        for i, (images, target) in enumerate(train_loader):
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            if args.loop_ms:
                images = per_batch_work(images, args.loop_ms)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            step += 1
            progress["step"] = step
            if i % args.print_freq == 0:
                print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\tTime {time.time() - end:.3f}\tLoss {loss.item():.4f}", flush=True)
            end = time.time()
            if args.crash_at is not None and step >= args.crash_at:
                raise RuntimeError(f"planted crash at step {step}")
            if args.interrupt_at is not None and step >= args.interrupt_at:
                raise KeyboardInterrupt
            if args.exit_at is not None and step >= args.exit_at:
                sys.exit(f"planted exit at step {step}: out of patience")
            if args.stop_at is not None and step >= args.stop_at:
                break
        scheduler.step()
        if val_loader is not None:
            validate(val_loader, model, criterion, device)
        if args.checkpoint:
            torch.save({"epoch": epoch + 1, "step": step, "state_dict": model.state_dict()}, args.checkpoint)
        if args.stop_at is not None and step >= args.stop_at:
            break
    print(f"trained {step} steps", flush=True)


if __name__ == "__main__":
    main()
