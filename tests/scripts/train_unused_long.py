"""A script that builds a long DataLoader it never iterates (a full-set loader kept for later) and trains on a short
one: the training loader is the short one, though the script holds a longer epoch. ``argv[1]``: epochs to train."""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

epochs = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=8)
full = DataLoader(TensorDataset(torch.randn(800, 4), torch.randint(0, 2, (800,))), batch_size=8)  # built, never iterated
for epoch in range(epochs):
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")
