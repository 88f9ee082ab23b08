"""The article's model, loss, optimizer and training step."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torchvision

from fastpipe.errors import ConfigError

ARTICLE_MODEL = "resnet50"


def build_model(name: str = ARTICLE_MODEL, num_classes: int = 10) -> torch.nn.Module:
    """A torchvision classification model by name (the article prints none; resnet50 by default)."""
    try:
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    except ValueError as exc:
        raise ConfigError(f"unknown torchvision model '{name}'; try resnet50, resnet18 or mobilenet_v3_small") from exc


def make_train_step(model: torch.nn.Module, criterion: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Any], None]:
    """The article's ``train_step``: forward, loss, zero_grad(set_to_none=True), backward, step."""

    def train_step(batch: Any) -> None:
        inputs, labels = batch
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return train_step


def build_training(
    device: torch.device, model_name: str = ARTICLE_MODEL, num_classes: int = 10
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[[Any], None]]:
    """Model on ``device``, CrossEntropyLoss, SGD(lr=0.001, momentum=0.9), and the step."""
    model = build_model(model_name, num_classes).to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    return model, optimizer, make_train_step(model, criterion, optimizer)
