"""A small training script whose step varies by ±30% from one step to the next, as a busy neighbour makes it vary.

Each step runs a tiny model on the CPU, then waits (or, with ``--burn``, burns CPU) a random 70-130% of ``--step-ms``
(``--jitter 0.3``), drawn from its own generator. Its input pipeline is cheap unless ``--slow-ms`` plants the slow
stage of the other test scripts (``SlowFilter``, a wait per sample). Nothing in it knows fastpipe: ``fastpipe diagnose
-- python tests/scripts/train_noisy.py`` must either say it cannot decide, or name only stages beyond their noise.
"""

import argparse
import random
import time

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from planted import SlowFilter

parser = argparse.ArgumentParser(description="a training loop whose step varies by ±jitter")
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("--samples", default=4000, type=int)
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("--step-ms", default=30.0, type=float, help="the step's mean extra time")
parser.add_argument("--jitter", default=0.3, type=float, help="each step takes a uniform 1 ± jitter of --step-ms")
parser.add_argument("--burn", action="store_true", help="burn CPU for the extra time instead of waiting")
parser.add_argument("--slow-ms", default=0.0, type=float, help="the planted stage's wait per sample (0: none)")
parser.add_argument("--seed", default=0, type=int)


def extra(ms: float, burn: bool) -> None:
    """The step's varying part: a wait (another process holds the device) or CPU burnt (one holds the cores)."""
    if not burn:
        time.sleep(ms / 1000)
        return
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    jitter = random.Random(args.seed + 1)  # its own generator: the neighbour's load does not follow the script's seeds
    stages = [transforms.RandomResizedCrop(32)]
    if args.slow_ms:
        stages.append(SlowFilter(args.slow_ms))
    stages += [transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]
    dataset = datasets.FakeData(args.samples, (3, 40, 40), 10, transforms.Compose(stages))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    step = 0
    for epoch in range(args.epochs):
        for i, (images, target) in enumerate(loader):
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            extra(args.step_ms * jitter.uniform(1 - args.jitter, 1 + args.jitter), args.burn)
            step += 1
            if i % 200 == 0:
                print(f"Epoch: [{epoch}][{i}/{len(loader)}] loss {loss.item():.3f}", flush=True)
    print(f"trained {step} steps", flush=True)


if __name__ == "__main__":
    main()
