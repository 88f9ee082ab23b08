"""Read a user's torchvision transform and take over the part of it the JPEG decoder can do.

:func:`absorb` looks at the start of a ``transform`` (v1 ``torchvision.transforms`` or v2, a
``Compose`` or a single transform) for a crop the decoder can produce directly:

* ``RandomResizedCrop(size, scale, ratio)``: the box is drawn from the header's size with
  torchvision's own ``get_params`` (same torch RNG calls in the same order, so the same seed
  draws the same boxes), and only the box is decoded (:class:`~fastpipe.datasets.crop.DecodeCrop`);
  timm's ``RandomResizedCropAndInterpolation`` with a bilinear interpolation too: its ``get_params`` is the
  same algorithm on Python's ``random``, so the boxes have the same distribution, not the same draws;
* ``Resize(s)``, ``CenterCrop(c)`` or ``Resize(s)`` + ``CenterCrop(c)`` (the validation recipe):
  the image is decoded straight to the resized size, at the DCT scale that covers it, and the
  centre is sliced out (:class:`DecodeResized`); a ``CenterCrop`` alone decodes only its box;
* followed optionally by ``RandomHorizontalFlip(p)``, fused into the decode (its coin is drawn
  after the box, as in the usual recipe).

The decoder gives a uint8 (3, h, w) tensor where the transform would have had a PIL image, so
what follows is handled by what it is: ``ToTensor`` becomes the same division on the tensor,
``PILToTensor`` is dropped (there is nothing left to convert), v2's ``ToImage`` accepts the
tensor, and everything after such a conversion runs unchanged (it always saw tensors). Anything
else that follows the crop (``ColorJitter`` on a PIL image, say) gets a PIL image made from the
decoded crop (:class:`ToPIL`) and runs unchanged: it is not absorbed, because its tensor kernel
does not give the same pixels. Interpolations other than bilinear, a flip before the crop, a
crop that runs on a tensor (``ToImage`` first) and a custom ``loader`` are not absorbed either;
:class:`FastPath` says which prefix was taken over and why the rest was not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from fastpipe.datasets.crop import DEFAULT_RATIO, DEFAULT_SCALE, DecodeCrop, as_size
from fastpipe.datasets.resized import DecodeResized
from fastpipe.stages import split_transform


@dataclass(frozen=True)
class FastPath:
    """What :func:`absorb` took over from a transform, what runs after it, and why the rest was not absorbed.

    Attributes:
        absorbed: the user's transforms the decoder now does, by class name, in order (empty: none).
        decode: the decode stage (``DecodeCrop`` or ``DecodeResized``), or None when nothing was absorbed.
        rest: what runs after the decode, in order (the user's own objects, plus :class:`ToTensor` /
            :class:`ToPIL` where the decoder's tensor meets them).
        rest_on: ``"tensor"`` (the rest sees the tensors it saw before), ``"PIL image"`` (it is
            given a PIL image made from the crop) or ``"nothing"`` (no rest).
        why_not: why the rest (or the whole transform) was not absorbed; None when everything was.
    """

    absorbed: tuple[str, ...]
    decode: Any = None
    rest: tuple[Callable[[Any], Any], ...] = field(default=())
    rest_on: str = "nothing"
    why_not: str | None = None

    @property
    def active(self) -> bool:
        return self.decode is not None

    def __str__(self) -> str:
        if not self.active:
            return f"not absorbed: {self.why_not}; the file is decoded whole by the loader, as torchvision does"
        head = f"decoder does {' + '.join(self.absorbed)} ({self.decode!r})"
        rest = "" if self.rest_on == "nothing" else f"; the rest runs on a {self.rest_on}"
        if len(self.rest) == 1 and isinstance(self.rest[0], ToPIL) and self.rest_on == "nothing":
            rest = "; returns the crop as a PIL image, as torchvision does"
        return f"{head}{rest}" + (f"; not absorbed: {self.why_not}" if self.why_not else "")


class ToTensor:
    """torchvision's ``ToTensor`` for the decoder's uint8 (3, h, w) tensor: float32 in [0, 1], the same values.

    (``ToTensor`` on the PIL crop permutes to CHW, then divides by 255; the decoder already gives CHW.)
    """

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32).div_(255)

    def __repr__(self) -> str:
        return "ToTensor(from the decoder's uint8)"


class ToPIL:
    """The decoder's uint8 (3, h, w) tensor as the RGB PIL image the rest of the transform expects."""

    def __call__(self, image: torch.Tensor) -> Any:
        from PIL import Image

        return Image.fromarray(image.permute(1, 2, 0).contiguous().numpy(), "RGB")

    def __repr__(self) -> str:
        return "ToPIL()"


def _kinds() -> dict[str, tuple[type, ...]]:
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    return {
        "rrc": (v1.RandomResizedCrop, v2.RandomResizedCrop),
        "resize": (v1.Resize, v2.Resize),
        "center": (v1.CenterCrop, v2.CenterCrop),
        "flip": (v1.RandomHorizontalFlip, v2.RandomHorizontalFlip),
        "to_float": (v1.ToTensor, v2.ToTensor),
        "to_uint8": (v1.PILToTensor, v2.PILToTensor),
        "to_image": (v2.ToImage,),
        "on_tensor_first": (v1.PILToTensor, v2.PILToTensor, v2.ToImage, v1.ToTensor, v2.ToTensor),
    }


#: timm's transforms (``timm.data.transforms``) of each kind, by class name: timm is optional, and never imported here.
TIMM_KINDS = {
    "rrc": ("RandomResizedCropAndInterpolation",),
    "to_float": ("MaybeToTensor",),
    "to_uint8": ("MaybePILToTensor",),
    "on_tensor_first": ("MaybeToTensor", "MaybePILToTensor", "ToNumpy", "ToTensor"),
}


def _isa(t: Any, kind: str, kinds: dict[str, tuple[type, ...]]) -> bool:
    """Whether ``t`` is a transform of ``kind``: torchvision's classes, or timm's of that kind by name."""
    if isinstance(t, kinds[kind]):
        return True
    cls = type(t)
    return cls.__module__.startswith("timm.") and any(c.__name__ in TIMM_KINDS.get(kind, ()) for c in cls.__mro__)


def _bilinear(t: Any) -> str | None:
    """Why ``t``'s interpolation cannot be the decoder's (PIL's bilinear), or None when it can."""
    from torchvision.transforms import InterpolationMode

    mode = getattr(t, "interpolation", InterpolationMode.BILINEAR)
    if isinstance(mode, (tuple, list)):  # timm's interpolation="random": one of these per image
        names = " or ".join(str(getattr(m, "value", m)) for m in mode)
        return f"{type(t).__name__} draws its interpolation per image ({names}); the decoder resizes bilinearly"
    name = getattr(mode, "value", mode)  # an InterpolationMode, its value as a str (some v2 transforms), or PIL's int
    if name not in ("bilinear", 2):  # 2: PIL.Image.BILINEAR, which torchvision still accepts
        return f"{type(t).__name__} uses {name} interpolation; the decoder resizes bilinearly"
    return None


def _crop_prefix(leaves: Sequence[Any]) -> tuple[Any, list[str], int, str | None]:
    """The decode stage for the crop at the start of ``leaves``: (stage or None, names absorbed, leaves used, why not)."""
    kinds = _kinds()
    if not leaves:
        return None, [], 0, "the transform is empty"
    first = leaves[0]
    name = type(first).__name__
    if _isa(first, "rrc", kinds):
        why = _bilinear(first)
        if why:
            return None, [], 0, why
        return ("rrc", first), [name], 1, None
    if isinstance(first, kinds["resize"]):
        why = _bilinear(first)
        if why:
            return None, [], 0, why
        if len(leaves) > 1 and isinstance(leaves[1], kinds["center"]):
            return ("resize", first, leaves[1]), [name, type(leaves[1]).__name__], 2, None
        return ("resize", first, None), [name], 1, None
    if isinstance(first, kinds["center"]):
        return ("resize", None, first), [name], 1, None
    if _isa(first, "on_tensor_first", kinds):
        return None, [], 0, f"it starts with {name}, so the crop runs on a tensor; put {name} after the crop to let the decoder do it"
    return None, [], 0, f"it starts with {name}, not a crop the decoder can do (RandomResizedCrop, Resize, CenterCrop)"


def _decode_stage(prefix: tuple[Any, ...], hflip: float, on_error: str) -> Any:
    kind = prefix[0]
    if kind == "rrc":
        t = prefix[1]
        return DecodeCrop(as_size(tuple(t.size)), t.scale, t.ratio, hflip, on_error=on_error)
    resize, center = prefix[1], prefix[2]
    size = None if resize is None else resize.size
    return DecodeResized(
        resize=[size] if isinstance(size, int) else (None if size is None else list(size)),
        max_size=None if resize is None else getattr(resize, "max_size", None),
        crop=None if center is None else as_size(tuple(center.size) if len(center.size) == 2 else (center.size[0],) * 2),
        hflip=hflip,
        on_error=on_error,
    )


def absorb(transform: Any, loader_is_default: bool = True, on_error: str = "raise") -> FastPath:
    """Split ``transform`` into the prefix the decoder does and the rest; see the module docstring.

    Args:
        transform: the user's transform (v1 or v2, a Compose or one transform), or None.
        loader_is_default: False when the dataset has a custom ``loader``: nothing is absorbed,
            since fastpipe cannot know what the loader returns.
        on_error: passed to the decode stage (``"raise"`` or ``"pil"``).
    """
    if not loader_is_default:
        return FastPath((), why_not="a custom loader: fastpipe cannot know what it returns, so it is kept")
    if transform is None:
        return FastPath((), why_not="no transform: each item is the whole image, decoded by PIL as torchvision does")
    leaves = [stage.transform for stage in split_transform(transform)]
    prefix, names, used, why = _crop_prefix(leaves)
    if prefix is None:
        return FastPath((), why_not=why)
    kinds = _kinds()
    hflip = 0.0
    # a flip with p=0 still draws its coin in torchvision, and the decoder draws none for p=0: it stays in the rest
    if used < len(leaves) and isinstance(leaves[used], kinds["flip"]) and leaves[used].p > 0:
        hflip = float(leaves[used].p)
        names.append(type(leaves[used]).__name__)
        used += 1
    decode = _decode_stage(prefix, hflip, on_error)
    rest = leaves[used:]
    if not rest:
        return FastPath(tuple(names), decode, (ToPIL(),), "nothing", None)
    head, tail = rest[0], rest[1:]
    if _isa(head, "to_float", kinds):
        return FastPath((*names, type(head).__name__), decode, (ToTensor(), *tail), "tensor" if tail else "nothing")
    if _isa(head, "to_uint8", kinds):
        return FastPath((*names, type(head).__name__), decode, tuple(tail), "tensor" if tail else "nothing")
    if isinstance(head, kinds["to_image"]):
        return FastPath(tuple(names), decode, tuple(rest), "tensor")
    why_rest = (
        f"{type(head).__name__} and what follows run on a PIL image made from the crop "
        "(only ToTensor, PILToTensor or ToImage right after the crop lets the rest run on the decoder's tensor)"
    )
    return FastPath(tuple(names), decode, (ToPIL(), *rest), "PIL image", why_rest)


def explicit(size: Any, scale: Sequence[float], ratio: Sequence[float], hflip: float, transform: Any, on_error: str) -> FastPath:
    """The explicit fast form ``ImageFolder(root, size=..., ...)``: RandomResizedCrop + flip decoded, ``transform`` on the uint8 tensor."""
    decode = DecodeCrop(
        size, scale if scale is not None else DEFAULT_SCALE, ratio if ratio is not None else DEFAULT_RATIO, hflip, on_error=on_error
    )
    names = ("RandomResizedCrop", "RandomHorizontalFlip") if hflip > 0 else ("RandomResizedCrop",)
    rest = () if transform is None else (transform,)
    return FastPath(names, decode, rest, "tensor" if rest else "nothing")
