"""timm's training loop, small: its real ``create_loader`` (the PrefetchLoader, which asks its DataLoader for the next
batch before it hands the script the current one), its gradient accumulation arithmetic from ``train.py`` (the
accumulation steps of the epoch's last batches worked out from ``len(loader)``: a batch index past the epoch gives
``accum_steps == 0`` and a modulo by zero), and a checkpoint of the model and optimizer at each epoch's end, as
timm's CheckpointSaver writes (no validation pass between: the checkpoint is the first thing the script does after
the epoch). ``--trace PATH`` saves the model's state before each step, with the global step. Nothing in it knows
fastpipe.
"""

import argparse
import copy

import timm
import timm.data
import torch
import torchvision.datasets as datasets

parser = argparse.ArgumentParser(description="timm's loop with gradient accumulation and per-epoch checkpoints")
parser.add_argument("--model", default="test_resnet")
parser.add_argument("-b", "--batch-size", default=16, type=int)
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--samples", default=200, type=int)
parser.add_argument("--img-size", default=32, type=int)
parser.add_argument("--grad-accum-steps", default=1, type=int)
parser.add_argument("--output", default=None, help="write checkpoint-EPOCH.pt here at each epoch's end")
parser.add_argument("--trace", default=None)
parser.add_argument("--seed", default=42, type=int)


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = timm.create_model(args.model, pretrained=False, num_classes=10)
    data_config = timm.data.resolve_data_config(vars(args), model=model)
    loader = timm.data.create_loader(
        datasets.FakeData(args.samples, (3, 40, 40), 10),
        input_size=(3, args.img_size, args.img_size),
        batch_size=args.batch_size,
        is_training=True,
        use_prefetcher=True,
        mean=data_config["mean"],
        std=data_config["std"],
        num_workers=args.workers,
        device=torch.device("cpu"),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    progress = {"step": 0, "trace": []}
    try:
        for epoch in range(args.epochs):
            count = train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, progress)
            assert count == len(loader), f"epoch {epoch} held {count} batches, len(loader) is {len(loader)}"
            print(f"epoch {epoch}: {count} batches of {len(loader)}", flush=True)
            if args.output:
                state = {"epoch": epoch, "step": progress["step"], "model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, f"{args.output}/checkpoint-{epoch}.pt")
        print(f"trained {progress['step']} steps", flush=True)
    finally:
        if args.trace:
            torch.save(progress["trace"], args.trace)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, progress) -> int:
    """timm's ``train_one_epoch``, its accumulation and logging arithmetic as it is."""
    model.train()
    accum_steps = args.grad_accum_steps
    last_accum_steps = len(loader) % accum_steps
    updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps
    count = 0
    for batch_idx, (input, target) in enumerate(loader):
        count += 1
        assert batch_idx <= last_batch_idx, f"epoch {epoch}: batch index {batch_idx} past the epoch's {len(loader)} batches"
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        update_idx = batch_idx // accum_steps
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps
        if args.trace:
            progress["trace"].append((progress["step"], copy.deepcopy(model.state_dict())))
        loss = loss_fn(model(input), target)
        if accum_steps > 1:
            loss /= accum_steps
        loss.backward()
        if need_update:
            optimizer.step()
            optimizer.zero_grad()
        progress["step"] += 1
        if last_batch or batch_idx % 5 == 0:
            print(f"Train: {epoch} [{update_idx:>4d}/{updates_per_epoch}] batch {batch_idx}/{len(loader)}", flush=True)
    return count


if __name__ == "__main__":
    main()
