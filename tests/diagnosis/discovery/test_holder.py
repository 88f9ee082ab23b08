"""Which objects are opened into the chain they hold (issue 30, item 2): only those whose call is exactly that chain's."""

from __future__ import annotations

import torch
import torchvision.transforms as T

from fastpipe.diagnosis.discovery._holder import delegated_attribute, open_holder
from fastpipe.stages import split_transform

CHAIN = T.Compose([T.CenterCrop(8), T.PILToTensor()])


class Plain:
    def __init__(self) -> None:
        self.transforms = CHAIN

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(img)


class ThroughLocal:
    def __init__(self) -> None:
        self.pipeline = CHAIN

    def __call__(self, img):  # type: ignore[no-untyped-def]
        out = self.pipeline(img)
        return out


class AsModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.t = torch.nn.Sequential(T.CenterCrop(8), T.ConvertImageDtype(torch.float))

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.t(x)


class Twice:
    def __init__(self) -> None:
        self.transforms = CHAIN

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(self.transforms(img))


class ByProperty:
    @property
    def transforms(self):  # type: ignore[no-untyped-def]
        return CHAIN

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(img)


class Looping:
    def __init__(self) -> None:
        self.transforms = list(CHAIN.transforms)

    def __call__(self, img):  # type: ignore[no-untyped-def]
        for t in self.transforms:
            img = t(img)
        return img


def test_plain_delegations_are_opened() -> None:
    assert delegated_attribute(Plain()) == "transforms" and open_holder(Plain()) == [CHAIN]
    assert delegated_attribute(ThroughLocal()) == "pipeline"
    assert [type(s.transform).__name__ for s in split_transform(Plain(), open_holder)] == ["CenterCrop", "PILToTensor"]
    assert [type(s.transform).__name__ for s in split_transform(AsModule(), open_holder)] == ["CenterCrop", "ConvertImageDtype"]
    nested = Plain()
    nested.transforms = T.Compose([ThroughLocal(), T.ConvertImageDtype(torch.float)])  # a preset inside a preset
    assert [s.name for s in split_transform(nested, open_holder)] == ["CenterCrop", "PILToTensor", "ConvertImageDtype"]


def test_anything_else_stays_one_stage() -> None:
    for obj in (Twice(), ByProperty(), Looping(), T.RandomApply([T.CenterCrop(8)]), lambda x: x):
        assert open_holder(obj) is None, type(obj).__name__
    hooked = AsModule()
    hooked.register_forward_hook(lambda module, args, out: out)  # a hook runs code the inner stages would not
    assert open_holder(hooked) is None
    assert [s.name for s in split_transform(Plain())] == ["Plain"]  # without the opener, as before (absorb's view)
