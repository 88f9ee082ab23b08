"""What each known transform is, as data: the facts a fix depends on, one entry per library class.

A report that advises "compile it" for torchvision's ColorJitter, or "run it on the device on whole batches" for a
per-sample random crop, gives a fix that does not apply or that silently changes what the model sees. The advice
must know what the stage is, so this module lists, per class (torchvision v1 and v2, timm, and albumentations when it
is installed), the facts that decide which fix fits:

* ``takes``: what it is called on (``PIL``, ``tensor``, ``numpy``, ``dict``: albumentations' ``t(image=array)``);
* ``random``: ``"per sample"`` when each call draws its own parameters, ``"none"`` when it is deterministic;
* ``crop``: a :class:`CropFacts` when it is a crop or resize a decoder could do while decoding (and with which
  distribution and random generator), else None;
* ``on_device``: whether it can run after the copy on a whole batch without changing what the model sees:
  ``"yes"`` (Normalize, a dtype conversion), ``"per-sample parameters only"`` (a random flip, jitter or erasing: a
  batch call of torchvision's draws one parameter set for the whole batch, so it needs a kernel that draws per
  sample, such as kornia's with ``same_on_batch=False``), ``"no"`` (it takes PIL images, or its inputs differ in size
  so no batch exists before it);
* ``compile_helps``: False for a library transform (its pixels are already done by PIL's C code or torch's kernels);
  True only for the user's own code, where a Python loop may be the cost;
* ``converts``: the dtype a conversion hands out (:data:`UINT8`, :data:`FLOAT`, :data:`FLOAT_UNSCALED`), which decides
  whether the batches are uint8 and whether "ship uint8, normalize after the copy" matches the pipeline;
* ``to_tensor``: it turns the decoded image (a PIL image) into a tensor, which a decoder returning tensors replaces;
* ``decoder_fuses``: fastpipe's decoder (:func:`fastpipe.datasets.absorb`) can do it while decoding, where it stands
  in the order the decoder takes (a crop first, then a horizontal flip, then the conversion);
* ``drop_in``: fastpipe's compiled drop-in for this very class (the toy's naive RandomMask), or None.

The advice (:mod:`fastpipe.diagnosis.verdict._advice`) decides what a stage is from these facts alone, never from its
class name: a user's own ``class ToTensor`` is custom code, and a renamed subclass of torchvision's is torchvision's.

Classes are looked up by type, walking the MRO, so a user's subclass gets its library parent's facts, unless it
overrides the method that does the work (then it is the user's code: ``custom``). Entries name the class by its
public import path and are resolved only from modules already imported (``sys.modules``), so timm and
albumentations are never imported here. Anything not listed is ``custom``, honestly: nothing is guessed about it.

The stable API (for the fix builders and the advice): :func:`facts_for` (an object to its :class:`TransformFacts`),
:func:`facts_named` (a stage known by name alone), :class:`TransformFacts`, :class:`CropFacts`, the value constants
below, and :data:`CATALOG` (every entry).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from typing import Any

# ----- the values, named once --------------------------------------------------------------------------------------
PIL, TENSOR, NUMPY, DICT, UNKNOWN = "PIL", "tensor", "numpy", "dict", "unknown"
PER_SAMPLE, NONE = "per sample", "none"
YES, PER_SAMPLE_ONLY, NO = "yes", "per-sample parameters only", "no"
TV1, TV2, TIMM, ALBUMENTATIONS, FASTPIPE, CUSTOM = "torchvision v1", "torchvision v2", "timm", "albumentations", "fastpipe", "custom"
#: What a conversion hands out: uint8 pixels; float (in [0, 1], or normalized); float of the 0..255 values (timm's ToTensor).
UINT8, FLOAT, FLOAT_UNSCALED = "uint8", "float", "float 0-255"

#: Methods whose override makes a subclass the user's own code (its facts can no longer be the library's).
WORK_METHODS = ("__call__", "forward", "_transform", "transform", "apply", "get_params", "make_params", "_get_params")
#: Where fastpipe's own compiled parts live (not ``fastpipe.workloads``, whose naive stages are deliberately user code).
FASTPIPE_PACKAGES = ("fastpipe.datasets", "fastpipe.transforms", "fastpipe.ops", "fastpipe.loading")


@dataclass(frozen=True)
class CropFacts:
    """A crop or resize the decoder could do while decoding.

    Attributes:
        kind: ``"random resized"`` (a random box resized to the output), ``"resize"``, ``"center"``, ``"random"``
            (a random box at the output's size), ``"resize keep ratio"`` (timm's, optionally random).
        distribution: how its box is drawn, in words (what a decoder taking it over must reproduce).
        rng: the generator it draws from: ``"torch"``, ``"python random"`` or ``"none"`` (deterministic); the same
            seed gives the same boxes only from the same generator.
        interpolation: the attribute holding its interpolation (a decoder resizing bilinearly matches only bilinear).
    """

    kind: str
    distribution: str
    rng: str
    interpolation: str | None = "interpolation"


@dataclass(frozen=True)
class TransformFacts:
    """The facts about one transform class that decide which fix fits it (see the module docstring).

    Attributes:
        qualname: the class's public import path (``torchvision.transforms.RandomResizedCrop``), or for a custom
            transform its own module and name.
        library: :data:`TV1`, :data:`TV2`, :data:`TIMM`, :data:`ALBUMENTATIONS`, :data:`FASTPIPE` or :data:`CUSTOM`.
        role: what it does, in a word or two (``crop``, ``flip``, ``colour``, ``convert``, ``normalize``, ``erase``,
            ``augment policy``, ``geometry``, ``random container``, ``custom``...).
        takes: what it is called on.
        random: :data:`PER_SAMPLE`, :data:`NONE`, or :data:`UNKNOWN` (custom).
        crop: the crop a decoder could absorb, or None.
        on_device: :data:`YES`, :data:`PER_SAMPLE_ONLY`, :data:`NO`, or :data:`UNKNOWN` (custom).
        on_device_why: why, in words.
        compile_helps: whether compiling it could make it cheaper (only the user's own code).
        subclass: the user's class name when the facts were found through its MRO, else None.
        converts: :data:`UINT8`, :data:`FLOAT` or :data:`FLOAT_UNSCALED` for a transform whose output has that dtype
            whatever its input (a conversion, Normalize), else None.
        to_tensor: it converts the decoded image to a tensor (ToTensor, PILToTensor, v2's ToImage, timm's Maybe*).
        decoder_fuses: fastpipe's decoder takes it over where it stands in the decoder's order (see the module docstring).
        drop_in: the import path of fastpipe's compiled drop-in for this class, or None.
    """

    qualname: str
    library: str
    role: str
    takes: tuple[str, ...]
    random: str
    crop: CropFacts | None
    on_device: str
    on_device_why: str
    compile_helps: bool
    subclass: str | None = None
    converts: str | None = None
    to_tensor: bool = False
    decoder_fuses: bool = False
    drop_in: str | None = None

    @property
    def name(self) -> str:
        """The class's own name (the last part of ``qualname``)."""
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def custom(self) -> bool:
        return self.library == CUSTOM

    @property
    def takes_pil_only(self) -> bool:
        """Called on PIL images alone: nothing after the host-to-device copy can run it."""
        return self.takes == (PIL,)

    @property
    def library_native(self) -> bool:
        """A library's own transform (torchvision, timm, albumentations): native code, never "compile it"."""
        return self.library not in (CUSTOM, FASTPIPE) and not self.compile_helps

    @property
    def floats(self) -> bool:
        """It hands out float images (a float conversion or Normalize): 4x the bytes of uint8."""
        return self.converts in (FLOAT, FLOAT_UNSCALED)

    @property
    def ends_pil(self) -> bool:
        """The end of a pipeline's PIL part: a float conversion, or a conversion only PIL images pass (PILToTensor);
        what follows runs on tensors (a uint8 recipe keeps what comes before it and converts there)."""
        return self.floats or (self.to_tensor and self.takes_pil_only)

    def text(self) -> str:
        """The facts in one line, for a report: what it is and why some fixes do not apply."""
        if self.custom:
            return f"{self.name}: your own code ({self.on_device_why})"
        crop = f", a {self.crop.kind} crop the decoder could do" if self.crop else ""
        return (
            f"{self.name}: {self.library}'s {self.role}, already native code; takes {'/'.join(self.takes)}; "
            f"random: {self.random}{crop}; on the device on whole batches: {self.on_device}, as {self.on_device_why}"
        )


# ----- the entries -------------------------------------------------------------------------------------------------
_RRC = (
    "torchvision's RandomResizedCrop box: area uniform in scale x the image's, aspect log-uniform in ratio, "
    "position uniform; 10 tries, then the centre crop clamped to ratio"
)
RRC_TORCH = CropFacts("random resized", _RRC + "; torch's RNG (torch.empty(1).uniform_, torch.randint)", "torch")
RRC_PYTHON = CropFacts("random resized", _RRC + "; drawn with Python's random module, not torch's RNG", "python random")
RESIZE = CropFacts("resize", "the shorter side to size (or to (h, w)); deterministic", "none")
CENTER = CropFacts("center", "the centre box of the output's size; deterministic", "none", None)
RANDOM_CROP = CropFacts("random", "a box of the output's size at a uniform position (after optional padding); torch's RNG", "torch", None)
KEEP_RATIO = CropFacts(
    "resize keep ratio",
    "timm's ResizeKeepRatio: a resize to the target's ratio (longest/shortest mix), with optional random scale and "
    "aspect jitter drawn with Python's random module",
    "python random",
)

_VARIABLE = "its inputs differ in size, so no batch exists before it"
_PIL_IN = "it takes a PIL image, which exists only before the copy"
_DRAWS = "it draws its parameters per sample; torchvision called on a batch draws one set for the whole batch"
_SAME = "the same arithmetic on every sample, so a batch call gives what the model saw"
_PIL_OPS = "its ops are PIL's"


def _entry(
    path: str,
    library: str,
    role: str,
    takes: tuple[str, ...],
    random: str,
    on_device: str,
    why: str,
    crop: CropFacts | None = None,
    **facts: Any,
) -> TransformFacts:
    """One library entry (``compile_helps`` False); ``facts``: ``converts``, ``to_tensor``, ``decoder_fuses``, ``drop_in``."""
    return TransformFacts(path, library, role, takes, random, crop, on_device, why, compile_helps=False, **facts)


#: The conversion and decoder facts of torchvision's classes (v1 and v2 alike), by class: what each hands out, and what
#: fastpipe's decoder takes over (:func:`fastpipe.datasets.absorb`: RandomResizedCrop, Resize, CenterCrop, then
#: RandomHorizontalFlip, then ToTensor or PILToTensor; a RandomCrop is decoded by the advice's own box loader instead).
_TV_FACTS: dict[str, dict[str, Any]] = {
    "RandomResizedCrop": {"decoder_fuses": True},
    "Resize": {"decoder_fuses": True},
    "CenterCrop": {"decoder_fuses": True},
    "RandomHorizontalFlip": {"decoder_fuses": True},
    "ToTensor": {"converts": FLOAT, "to_tensor": True, "decoder_fuses": True},
    "PILToTensor": {"converts": UINT8, "to_tensor": True, "decoder_fuses": True},
    "Normalize": {"converts": FLOAT},
    "ConvertImageDtype": {"converts": FLOAT},
    "ToImage": {"converts": UINT8, "to_tensor": True},
    "ToDtype": {"converts": FLOAT},
}


_PT = (PIL, TENSOR)


def _torchvision(library: str, module: str) -> list[TransformFacts]:
    """The entries torchvision's v1 and v2 share (v2's also take tv_tensors, listed here as tensors)."""
    rows: list[tuple[str, str, tuple[str, ...], str, str, str, CropFacts | None]] = [
        ("RandomResizedCrop", "crop", _PT, PER_SAMPLE, NO, _VARIABLE, RRC_TORCH),
        ("Resize", "resize", _PT, NONE, NO, _VARIABLE, RESIZE),
        ("CenterCrop", "crop", _PT, NONE, NO, _VARIABLE, CENTER),
        ("RandomCrop", "crop", _PT, PER_SAMPLE, NO, _VARIABLE, RANDOM_CROP),
        ("FiveCrop", "crop", _PT, NONE, NO, _VARIABLE, None),
        ("TenCrop", "crop", _PT, NONE, NO, _VARIABLE, None),
        ("Pad", "geometry", _PT, NONE, NO, _VARIABLE, None),
        ("RandomHorizontalFlip", "flip", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomVerticalFlip", "flip", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomRotation", "geometry", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomAffine", "geometry", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomPerspective", "geometry", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("ElasticTransform", "geometry", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("ColorJitter", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("Grayscale", "colour", _PT, NONE, YES, _SAME, None),
        ("RandomGrayscale", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("GaussianBlur", "blur", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS + " (its sigma)", None),
        ("RandomInvert", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomPosterize", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomSolarize", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomAdjustSharpness", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomAutocontrast", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("RandomEqualize", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
        ("AutoAugment", "augment policy", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS + " (its ops and magnitudes)", None),
        ("RandAugment", "augment policy", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS + " (its ops and magnitudes)", None),
        ("TrivialAugmentWide", "augment policy", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS + " (its op and magnitude)", None),
        ("AugMix", "augment policy", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS + " (its chains and weights)", None),
        ("RandomErasing", "erase", (TENSOR,), PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS + " (one box for every sample)", None),
        ("Normalize", "normalize", (TENSOR,), NONE, YES, _SAME, None),
        ("ConvertImageDtype", "convert", (TENSOR,), NONE, YES, _SAME, None),
        ("LinearTransformation", "colour", (TENSOR,), NONE, YES, _SAME, None),
        (
            "ToTensor",
            "convert",
            (PIL, NUMPY),
            NONE,
            NO,
            _PIL_IN + " (its float scaling can move: uint8 out, Normalize after the copy)",
            None,
        ),
        ("PILToTensor", "convert", (PIL,), NONE, NO, _PIL_IN, None),
        ("ToPILImage", "convert", (TENSOR, NUMPY), NONE, NO, "it makes a PIL image, which exists only on the host", None),
    ]
    if library == TV2:
        rows += [
            ("ToImage", "convert", (PIL, NUMPY, TENSOR), NONE, NO, _PIL_IN, None),
            ("ToDtype", "convert", (TENSOR,), NONE, YES, _SAME, None),
            ("ToPureTensor", "convert", (TENSOR,), NONE, YES, _SAME, None),
            ("RGB", "colour", _PT, NONE, YES, _SAME, None),
            ("Identity", "identity", _PT, NONE, YES, _SAME, None),
            ("RandomResize", "resize", _PT, PER_SAMPLE, NO, _VARIABLE, None),
            ("RandomShortestSize", "resize", _PT, PER_SAMPLE, NO, _VARIABLE, None),
            ("ScaleJitter", "resize", _PT, PER_SAMPLE, NO, _VARIABLE, None),
            ("RandomZoomOut", "geometry", _PT, PER_SAMPLE, NO, _VARIABLE, None),
            ("RandomIoUCrop", "crop", _PT, PER_SAMPLE, NO, _VARIABLE, None),
            ("RandomPhotometricDistort", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
            ("RandomChannelPermutation", "colour", _PT, PER_SAMPLE, PER_SAMPLE_ONLY, _DRAWS, None),
            ("GaussianNoise", "noise", (TENSOR,), PER_SAMPLE, YES, "fresh noise for every pixel of every sample, on a batch too", None),
            ("JPEG", "compression", _PT, PER_SAMPLE, NO, "it encodes and decodes JPEG on the CPU", None),
        ]
    return [
        _entry(f"{module}.{name}", library, role, takes, random, dev, why, crop, **_TV_FACTS.get(name, {}))
        for name, role, takes, random, dev, why, crop in rows
    ]


_TIMM = [
    _entry(
        "timm.data.transforms.RandomResizedCropAndInterpolation",
        TIMM,
        "crop",
        _PT,
        PER_SAMPLE,
        NO,
        _VARIABLE,
        RRC_PYTHON,
        decoder_fuses=True,
    ),
    _entry("timm.data.transforms.ResizeKeepRatio", TIMM, "resize", _PT, PER_SAMPLE, NO, _VARIABLE, KEEP_RATIO),
    _entry("timm.data.transforms.CenterCropOrPad", TIMM, "crop", _PT, NONE, NO, _VARIABLE, None),
    _entry("timm.data.transforms.RandomCropOrPad", TIMM, "crop", _PT, PER_SAMPLE, NO, _VARIABLE, None),
    _entry("timm.data.transforms.RandomPad", TIMM, "geometry", _PT, PER_SAMPLE, NO, _VARIABLE, None),
    _entry("timm.data.transforms.TrimBorder", TIMM, "crop", _PT, NONE, NO, _VARIABLE, None),
    _entry(
        "timm.data.transforms.MaybeToTensor",
        TIMM,
        "convert",
        (PIL, NUMPY, TENSOR),
        NONE,
        NO,
        _PIL_IN + " (a tensor passes through; its float scaling can move: uint8 out, Normalize after the copy)",
        converts=FLOAT,
        to_tensor=True,
        decoder_fuses=True,
    ),
    _entry(
        "timm.data.transforms.MaybePILToTensor",
        TIMM,
        "convert",
        (PIL, TENSOR),
        NONE,
        NO,
        _PIL_IN + " (a tensor passes through unchanged)",
        converts=UINT8,
        to_tensor=True,
        decoder_fuses=True,
    ),
    # timm's ToTensor is pil_to_tensor(img).to(float32): float of the 0..255 values, no scaling (timm normalizes later)
    _entry("timm.data.transforms.ToTensor", TIMM, "convert", (PIL,), NONE, NO, _PIL_IN, converts=FLOAT_UNSCALED, to_tensor=True),
    _entry("timm.data.transforms.ToNumpy", TIMM, "convert", (PIL,), NONE, NO, _PIL_IN, converts=UINT8),
    _entry("timm.data.auto_augment.RandAugment", TIMM, "augment policy", (PIL,), PER_SAMPLE, NO, _PIL_IN + "; " + _PIL_OPS),
    _entry("timm.data.auto_augment.AutoAugment", TIMM, "augment policy", (PIL,), PER_SAMPLE, NO, _PIL_IN + "; " + _PIL_OPS),
    _entry("timm.data.auto_augment.AugMixAugment", TIMM, "augment policy", (PIL,), PER_SAMPLE, NO, _PIL_IN + "; " + _PIL_OPS),
    _entry(
        "timm.data.random_erasing.RandomErasing",
        TIMM,
        "erase",
        (TENSOR,),
        PER_SAMPLE,
        YES,
        "called on a batch it draws each sample's boxes itself, as timm's PrefetchLoader runs it on the GPU (device= must be the batch's)",
    ),
]

#: albumentations' common image transforms: called as ``t(image=array)`` on HWC uint8 NumPy arrays, returning a dict;
#: each call draws its own parameters. Resolved only when albumentations is already imported.
_ALBUMENTATIONS_NP = "it runs on NumPy arrays (OpenCV) on the host"
_ALBUMENTATIONS = (
    [
        _entry(f"albumentations.{name}", ALBUMENTATIONS, role, (DICT,), random, NO, _ALBUMENTATIONS_NP, crop)
        for name, role, random, crop in [
            ("RandomResizedCrop", "crop", PER_SAMPLE, None),
            ("Resize", "resize", NONE, None),
            ("CenterCrop", "crop", NONE, None),
            ("RandomCrop", "crop", PER_SAMPLE, None),
            ("SmallestMaxSize", "resize", NONE, None),
            ("LongestMaxSize", "resize", NONE, None),
            ("HorizontalFlip", "flip", PER_SAMPLE, None),
            ("VerticalFlip", "flip", PER_SAMPLE, None),
            ("ShiftScaleRotate", "geometry", PER_SAMPLE, None),
            ("Affine", "geometry", PER_SAMPLE, None),
            ("ColorJitter", "colour", PER_SAMPLE, None),
            ("RandomBrightnessContrast", "colour", PER_SAMPLE, None),
            ("HueSaturationValue", "colour", PER_SAMPLE, None),
            ("GaussianBlur", "blur", PER_SAMPLE, None),
            ("CoarseDropout", "erase", PER_SAMPLE, None),
        ]
    ]
    + [_entry("albumentations.Normalize", ALBUMENTATIONS, "normalize", (DICT,), NONE, NO, _ALBUMENTATIONS_NP, converts=FLOAT)]
    + [_entry("albumentations.pytorch.ToTensorV2", ALBUMENTATIONS, "convert", (DICT,), NONE, NO, "it converts the host's NumPy array")]
)

#: fastpipe's classes whose facts are more than "fastpipe's own compiled part": the ToTensor its ImageFolder keeps from
#: the user's transform (the same float scaling, on the decoder's uint8 tensor: its remedy is uint8 out, as for
#: torchvision's), and the toy's naive RandomMask, deliberately the user's kind of code, which has a compiled drop-in.
_FASTPIPE = [
    TransformFacts(
        "fastpipe.datasets.absorb.ToTensor",
        FASTPIPE,
        "convert",
        (TENSOR,),
        NONE,
        None,
        YES,
        _SAME,
        compile_helps=False,
        converts=FLOAT,
        to_tensor=True,
    ),
    TransformFacts(
        "fastpipe.workloads.toy.naive.RandomMask",
        CUSTOM,
        "erase",
        (TENSOR,),
        PER_SAMPLE,
        None,
        NO,
        "the article's naive mask: Python and SciPy on one image at a time",
        compile_helps=True,
        drop_in="fastpipe.transforms.RandomMask",
    ),
]

CATALOG: tuple[TransformFacts, ...] = (
    *_torchvision(TV1, "torchvision.transforms"),
    *_torchvision(TV2, "torchvision.transforms.v2"),
    *_TIMM,
    *_ALBUMENTATIONS,
    *_FASTPIPE,
)
"""Every entry, by public import path; :func:`facts_for` resolves them from the modules already imported."""

#: torchvision's own containers that run their list conditionally: one stage (never opened), facts from their contents.
CONTAINERS = ("RandomApply", "RandomChoice", "RandomOrder")


# ----- the lookup --------------------------------------------------------------------------------------------------
def _module_of(path: str) -> str:
    return path.rsplit(".", 1)[0]


def _catalog_modules() -> tuple[str, ...]:
    return tuple(sorted({_module_of(e.qualname) for e in CATALOG}))


@functools.lru_cache(maxsize=8)
def _resolved(loaded: frozenset[str]) -> dict[type, TransformFacts]:
    """Class -> entry for the entries whose module is imported (``loaded``); cached per set of imported modules."""
    table: dict[type, TransformFacts] = {}
    for entry in CATALOG:
        module = sys.modules.get(_module_of(entry.qualname)) if _module_of(entry.qualname) in loaded else None
        cls = getattr(module, entry.name, None) if module is not None else None
        if isinstance(cls, type):
            table.setdefault(cls, entry)  # v2 re-exports a few v1 classes; the first listed (v1) wins
    return table


def _table() -> dict[type, TransformFacts]:
    import torchvision.transforms  # noqa: F401  (always installed; timm and albumentations are only read if imported)
    import torchvision.transforms.v2  # noqa: F401

    return _resolved(frozenset(m for m in _catalog_modules() if m in sys.modules))


def _custom(
    transform: Any, why: str = "fastpipe knows nothing about it: whether it is random or takes PIL is yours to say"
) -> TransformFacts:
    cls = transform if isinstance(transform, type) else type(transform)
    func = getattr(transform, "func", transform)  # a functools.partial names its function
    if callable(func) and not isinstance(func, type) and hasattr(func, "__qualname__") and not hasattr(type(func), "forward"):
        path = f"{getattr(func, '__module__', '?')}.{func.__qualname__}"
    else:
        path = f"{cls.__module__}.{cls.__qualname__}"
    return TransformFacts(path, CUSTOM, "custom", (UNKNOWN,), UNKNOWN, None, UNKNOWN, why, compile_helps=True)


def _overrides(cls: type, parent: type) -> str | None:
    """The first work method a class between ``cls`` and ``parent`` in the MRO defines itself, or None."""
    for klass in cls.__mro__:
        if klass is parent:
            return None
        for method in WORK_METHODS:
            if method in vars(klass):
                return f"{klass.__qualname__}.{method}"
    return None


def facts_for(transform: Any) -> TransformFacts:
    """The catalog's facts about ``transform`` (an instance, or a class); a class it does not list is ``custom``.

    A subclass of a listed class gets its parent's facts (``subclass`` names it), unless it overrides a work method
    (:data:`WORK_METHODS`), which makes it the user's own code. torchvision's ``RandomApply``, ``RandomChoice`` and
    ``RandomOrder`` are random containers: their compile and device facts come from what they hold. fastpipe's own
    parts are ``fastpipe`` (already native; nothing else is known about them here). ``Lambda`` is the user's function.
    """
    cls = transform if isinstance(transform, type) else type(transform)
    table = _table()
    for parent in cls.__mro__:
        entry = table.get(parent)
        if entry is None:
            continue
        overridden = _overrides(cls, parent)
        if overridden is not None:
            return _custom(transform, f"a subclass of {entry.qualname} whose {overridden} is your own code")
        return entry if parent is cls else replace(entry, subclass=cls.__qualname__)
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    if isinstance(transform, (v1.Lambda, v2.Lambda)):
        return _custom(transform.lambd, "your function, wrapped in torchvision's Lambda")
    if cls.__name__ in CONTAINERS and cls.__module__.startswith("torchvision.transforms"):
        return _container(transform, cls)
    if any(cls.__module__ == p or cls.__module__.startswith(p + ".") for p in FASTPIPE_PACKAGES):
        return TransformFacts(
            f"{cls.__module__}.{cls.__qualname__}",
            FASTPIPE,
            "fastpipe part",
            (UNKNOWN,),
            UNKNOWN,
            None,
            UNKNOWN,
            "fastpipe's own compiled part",
            compile_helps=False,
        )
    return _custom(transform)


def facts_named(name: str) -> TransformFacts | None:
    """The catalog's entry for a stage known by its name alone (a stage a report names in a pipeline fastpipe did not
    see): the first entry whose class is called ``name`` (torchvision v1's before v2's and timm's), or None.

    Only for a stage without its object: an object's facts come from :func:`facts_for`, by type, so a user's own
    ``class ToTensor`` is custom code whatever its name.
    """
    return next((entry for entry in CATALOG if entry.name == name), None)


def _container(transform: Any, cls: type) -> TransformFacts:
    """A random container's facts: per sample (it draws whether, which or in which order), and no better than its contents."""
    inner = [facts_for(t) for t in getattr(transform, "transforms", []) if not isinstance(transform, type)]
    library = TV2 if ".v2" in cls.__module__ else TV1
    takes = tuple(sorted(set.intersection(*(set(f.takes) for f in inner)))) if inner else _PT
    device = NO if any(f.on_device in (NO, UNKNOWN) for f in inner) else PER_SAMPLE_ONLY
    why = _DRAWS + " (whether, which or in which order to apply its transforms)"
    if device == NO:
        why = "what it holds cannot run on the device on whole batches: " + "; ".join(
            f.text() for f in inner if f.on_device in (NO, UNKNOWN)
        )
    return TransformFacts(
        f"{cls.__module__.split('._')[0]}.{cls.__name__}",
        library,
        "random container",
        takes or (UNKNOWN,),
        PER_SAMPLE,
        None,
        device,
        why,
        compile_helps=any(f.compile_helps for f in inner),
    )
