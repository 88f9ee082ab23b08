"""A training script whose step stands for a 30 ms GPU step that uses no CPU, with short epochs and a validation pass
after each: what ``--device sim:30`` models in a factory, written as a script (script mode runs the script's own step,
so it refuses ``--device sim:MS``).

Nothing in it knows fastpipe. Each epoch is ``--batches`` batches (16 by default) of a small FakeData set whose
transforms hold the planted ``SlowFilter`` (``--slow-ms`` of waiting per sample in the workers: with 8 samples a
batch and 2 workers, 40 ms a batch against the 30 ms step, so the loop is input-bound by about 10 ms a step). The step
runs a tiny model (well under a millisecond of CPU) on one thread (``--threads``: a GPU step's host side is one
thread launching kernels; torch's default of a thread per core wakes them all after each sleep, which on a small shared
CPU costs more than the model), then sleeps ``--step-ms``, as a loop waits for its GPU.
After each epoch it evaluates on ``--val-batches`` batches and prints one line. It runs ``--epochs`` epochs (200 by
default: enough for a whole ladder when the ladder keeps the script's epochs, even a slow one of 800 steps on a loaded
machine; ``fastpipe diagnose`` stops it after its report).
"""

import argparse
import time

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from planted import SlowFilter

parser = argparse.ArgumentParser(description="short epochs, a validation pass each, and a step that sleeps like a GPU step")
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("--epochs", default=200, type=int)
parser.add_argument("--batches", default=16, type=int, help="batches in each training epoch")
parser.add_argument("--val-batches", default=4, type=int, help="batches in each validation pass")
parser.add_argument("--step-ms", default=30.0, type=float, help="the step's sleep: a GPU step that uses no CPU")
parser.add_argument("--slow-ms", default=10.0, type=float, help="the planted stage's wait per sample")
parser.add_argument("--image-size", default=16, type=int)
parser.add_argument("--threads", default=1, type=int, help="torch's intra-op threads for the tiny model")
parser.add_argument("--seed", default=0, type=int)


def loader(samples: int, slow_ms: float, args: argparse.Namespace, offset: int = 0) -> torch.utils.data.DataLoader:
    stages = [SlowFilter(slow_ms)] if slow_ms else []
    dataset = datasets.FakeData(
        samples, (3, args.image_size, args.image_size), 10, transforms.Compose([*stages, transforms.ToTensor()]), random_offset=offset
    )
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=offset == 0, num_workers=args.workers)


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * args.image_size**2, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    train_loader = loader(args.batches * args.batch_size, args.slow_ms, args)
    val_loader = loader(args.val_batches * args.batch_size, 0.0, args, offset=1)
    step = 0
    for epoch in range(args.epochs):
        model.train()
        began, steps = time.perf_counter(), 0
        for images, target in train_loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.step_ms / 1000)  # the GPU's share of the step: the host waits, using no CPU
            step += 1
            steps += 1
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, target in val_loader:
                correct += int((model(images).argmax(1) == target).sum())
                seen += len(target)
        took = time.perf_counter() - began
        print(f"epoch {epoch}: {steps} steps in {took:.2f} s, val acc {100 * correct / max(1, seen):.1f}%", flush=True)
    print(f"trained {step} steps", flush=True)


if __name__ == "__main__":
    main()
