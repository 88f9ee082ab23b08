"""A training script in the style of nanoGPT's ``train.py``, small: no DataLoader. Its tokens are a memmapped uint16
array (written to ``--data-dir`` first, as nanoGPT's prepare.py does), and ``get_batch`` cuts ``--batch-size``
random windows of ``--block-size`` tokens from it on each call; the loop is top-level code, as in nanoGPT.
``--slow-ms`` plants a wait in ``get_batch`` (a slow disk, say). ``--generator`` makes the loop iterate a generator
of batches instead (``for X, Y in batches('train')``). Nothing in it knows fastpipe, except ``--declared``: the loop
iterates a DataLoader over the declaration fastpipe prints for ``get_batch`` (``fastpipe.stages.Stages(source=...,
transforms=[...])``: the raw items are the random offsets, the stages read a window and wait ``--slow-ms`` a sample).
"""

import argparse
import os
import time

import numpy as np
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", required=True)
parser.add_argument("--batch-size", default=8, type=int)
parser.add_argument("--block-size", default=32, type=int)
parser.add_argument("--max-iters", default=60, type=int)
parser.add_argument("--slow-ms", default=20.0, type=float)
parser.add_argument("--generator", action="store_true")
parser.add_argument("--declared", action="store_true")
parser.add_argument("--workers", default=2, type=int)
args = parser.parse_args()

vocab = 64
os.makedirs(args.data_dir, exist_ok=True)
path = os.path.join(args.data_dir, "train.bin")
if not os.path.exists(path):
    np.random.default_rng(0).integers(0, vocab, 20_000, dtype=np.uint16).tofile(path)


def get_batch(split):
    # as nanoGPT: a new memmap every batch, random offsets, int64 tensors
    data = np.memmap(os.path.join(args.data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + args.block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + args.block_size].astype(np.int64)) for i in ix])
    time.sleep(args.slow_ms / 1000)
    return x, y


def batches(split):
    for _ in range(args.max_iters):
        yield get_batch(split)


class Offsets:
    """The raw items get_batch draws: random window starts, a new stream at each iter() (each worker seeds its own)."""

    def __iter__(self):
        data = np.memmap(os.path.join(args.data_dir, "train.bin"), dtype=np.uint16, mode="r")
        while True:
            yield int(torch.randint(len(data) - args.block_size, (1,)))


def read_window(i):
    data = np.memmap(os.path.join(args.data_dir, "train.bin"), dtype=np.uint16, mode="r")
    return (
        torch.from_numpy(data[i : i + args.block_size].astype(np.int64)),
        torch.from_numpy(data[i + 1 : i + 1 + args.block_size].astype(np.int64)),
    )


class SlowDisk:
    """The planted wait, per sample here (get_batch's is per batch)."""

    def __call__(self, xy):
        time.sleep(args.slow_ms / 1000)
        return xy


class GetBatchStream(torch.utils.data.IterableDataset):  # what get_batch makes, as a stream
    def __init__(self):
        import fastpipe.stages

        self.stages = fastpipe.stages.Stages(source=Offsets(), transforms=[read_window, SlowDisk()])

    def __iter__(self):
        return iter(self.stages)


model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(X, Y):
    logits = model(X)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), Y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


if args.declared:
    loader = torch.utils.data.DataLoader(GetBatchStream(), batch_size=args.batch_size, num_workers=args.workers)
    for iter_num, (X, Y) in enumerate(loader):
        loss = step(X, Y)
        if iter_num + 1 >= args.max_iters:
            break
elif args.generator:
    for iter_num, (X, Y) in enumerate(batches("train")):
        loss = step(X, Y)
else:
    X, Y = get_batch("train")
    iter_num = 0
    while True:
        loss = step(X, Y)
        X, Y = get_batch("train")  # prefetch the next batch, as nanoGPT does
        iter_num += 1
        if iter_num >= args.max_iters:
            break
print(f"iter {iter_num}: loss {loss.item():.4f}")
