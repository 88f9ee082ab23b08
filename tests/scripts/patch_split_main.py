"""A small script whose dataset comes from a function in another file (``patch_data.build_dataset``); the loop copies
with ``inputs = inputs.to(device)``. Nothing in it knows fastpipe. ``--steps N`` stops after N steps."""

import argparse

import torch
from patch_data import build_dataset
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("--steps", default=3, type=int)
args = parser.parse_args()

device = torch.device("cpu")
train_data = build_dataset(args.root, 32)
loader = torch.utils.data.DataLoader(train_data, batch_size=4, shuffle=True, num_workers=0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
for step, (inputs, labels) in enumerate(loader):
    inputs = inputs.to(device)
    labels = labels.to(device)
    loss = nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    print(f"step {step} loss {loss.item():.4f} input {tuple(inputs.shape)} {inputs.dtype}", flush=True)
    if step + 1 >= args.steps:
        break
