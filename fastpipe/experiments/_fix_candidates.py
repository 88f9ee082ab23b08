"""Fixes as rewrites of the user's own pipeline: each candidate is the user's workload with one thing changed.

:func:`build_candidates` reads where the loader's dataset keeps its transform (``find_pipeline``), opens a preset
object that holds its stages in a ``transforms`` Compose (torchvision's ``ClassificationPresetTrain``, users' own:
:func:`inner_leaves`), and builds, for what the stages really are:

* **decode the crop**: the dataset as ``fastpipe.datasets.ImageFolder(root, transform=<the same transforms>)``, which
  takes over a leading crop the JPEG decoder can do (:func:`fastpipe.datasets.absorb.absorb`: torchvision's and timm's
  RandomResizedCrop with bilinear interpolation, Resize + CenterCrop); otherwise "not absorbed: why";
* **uint8 over the copy**: a float conversion and ``Normalize`` at the transform's end removed, the same Normalize run
  on the device after the copy (:class:`fastpipe.transforms.Normalize`, 4x fewer bytes over the copy); not when a
  transform follows Normalize (it would see uint8, or run per batch);
* both together, and fastpipe's ThreadLoader over the result (batches decoded by native threads, one process);
* **loader settings**: the ``num_workers`` and ``prefetch_factor`` a short ``tune`` sweep recommends (fix runs it over
  1, 2, 4, ... workers and the usable cores: :func:`sweep_counts`; ``fastpipe tune`` measures every count), and
  recycled batch memory (:func:`fastpipe.loading.recycled`) for a loader with workers;
* **a compiled kernel** for a transform of the user's own (the catalog's ``compile_helps``): advice only, never tried, since
  fastpipe does not write code that claims to be equivalent.

Each candidate carries the code to apply and how its input is checked (:mod:`fastpipe.experiments._fix_checks`).
No per-sample random transform is ever moved onto the device on whole batches: that would draw one parameter set per
batch, another augmentation. Whether a crop can be absorbed is ``absorb``'s to say (it builds the decode stage); whether
a transform is the user's own code, and which generator a crop draws from, the transform catalog's (``facts_for``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence

from torch.utils.data import DataLoader

from fastpipe.datasets.absorb import absorb
from fastpipe.datasets.crop import crop_params
from fastpipe.diagnosis.discovery._catalog import facts_for
from fastpipe.diagnosis.discovery._holder import delegated_attribute, open_holder
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.experiments._fix_checks import BoxDraw
from fastpipe.experiments._fix_keep import custom_collate, refusal
from fastpipe.experiments._tune_result import TuneResult
from fastpipe.loading._rebuild import discard_loader, rebuild_loader
from fastpipe.loading._unwrap import TimmPrefetchTransform, chain
from fastpipe.stages import split_transform
from fastpipe.workloads._workload import Workload

#: How many files' headers are read for the image sizes the crop-box test draws for.
SIZE_SAMPLE = 64
#: Why pixels are not compared for a fix that changes the worker count (labels, shapes and dtypes still are).
WORKERS_DRAW = "each worker draws the random transforms from its own seed: another worker count gives other draws"
#: What the samples a collate_fn gets become when Normalize moves after the copy.
_UINT8_SAMPLES = "uint8 images (the float conversion and Normalize moved after the copy)"


@dataclass
class Candidate:
    """One fix: what it changes, the code to apply, the rewritten workload, and how its input is checked.

    Attributes:
        name: what the fix does, in words.
        addresses: the stages it takes over or changes (the pipeline's names, ``raw load`` for reading the file).
        code: the change to make in the user's code.
        workload: the user's workload with the fix applied; None when it is advice only or cannot be built.
        not_tried: why it is not measured (None: it is).
        compare_pixels: None to compare pixels; else why they cannot be compared (the crop-box test stands instead).
        boxes: the original crop's and the fix's box draws, with image sizes, for the distribution test.
        direct: the fix changes only the loader: check its own first batch, workers and all.
        changes_samples: what the samples the loader's ``collate_fn`` gets become (None: the same as the original's);
            a custom collate_fn then refuses the fix (:mod:`fastpipe.experiments._fix_keep`).
        transform: the candidate's transform where it rewrote the dataset's (None: the dataset's own).
        original: the user's workload it was built from.

    The live objects (``loader``, ``dataset``, ``transform`` and the ``original_*`` ones) are what a patch writer
    needs to find where the script built each thing the fix changes.
    """

    name: str
    addresses: tuple[str, ...]
    code: str
    workload: Workload | None = None
    not_tried: str | None = None
    compare_pixels: str | None = None
    boxes: tuple[BoxDraw, BoxDraw, Sequence[tuple[int, int]]] | None = None
    direct: bool = False
    changes_samples: str | None = None
    transform: Any = None
    original: Workload | None = None
    parts: tuple[str, ...] = ()
    """For a combined candidate, the names of the single fixes it joins (:mod:`fastpipe.experiments._fix_combined`)."""
    kind: str = ""
    """What it changes, for combining: ``dataset`` (the transform or the dataset class, the DataLoader kept),
    ``settings`` (num_workers/prefetch_factor), ``recycled``, ``loader`` (the DataLoader replaced); "" for advice."""

    @property
    def loader(self) -> Any:
        """The candidate's loader (None when it is advice only or could not be built)."""
        return None if self.workload is None else self.workload.loader

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def original_loader(self) -> Any:
        return None if self.original is None else self.original.loader

    @property
    def original_dataset(self) -> Any:
        return getattr(self.original_loader, "dataset", None)

    @property
    def original_transform(self) -> Any:
        """The transform in the original dataset's slot that the fixes rewrite (None when it cannot be read)."""
        if self.original is None:
            return None
        view, _ = view_of(self.original)
        return None if view is None else view.transform


@dataclass
class PipelineView:
    """Where the loader's dataset keeps its transform, and that transform's leaves (a preset opened)."""

    dataset: Any
    pipeline: Any
    owner: Any
    transform: Any
    leaves: list[Any]
    via: str | None
    """``ClassificationPresetTrain.transforms`` when the leaves were found inside a preset object; None otherwise."""


def _module(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def inner_leaves(transform: Any) -> tuple[list[Any], str | None]:
    """The leaves of ``transform``, opened as discovery opens them (a Compose, and a preset object whose call only
    passes its input to a chain it holds: :func:`fastpipe.diagnosis.discovery._holder.open_holder`), and where they were
    found when ``transform`` is such a preset (``"ClassificationPresetTrain.transforms"``; None otherwise)."""
    attr = delegated_attribute(transform) if open_holder(transform) is not None else None
    leaves = [stage.transform for stage in split_transform(transform, open_holder)]
    return leaves, None if attr is None else f"{type(transform).__name__}.{attr}"


def view_of(workload: Workload) -> tuple[PipelineView | None, str | None]:
    """The loader's dataset's transform and its leaves, or (None, why not)."""
    dataset = getattr(workload.loader, "dataset", None)
    if dataset is None:
        return None, f"the loader ({type(workload.loader).__name__}) has no dataset"
    pipeline, why = find_pipeline(dataset)
    if pipeline is None:
        return None, why
    if pipeline.parts or pipeline.kind not in ("attribute", "standard", "stages"):
        return None, f"its transform is a {pipeline.kind} pipeline ({pipeline.source or 'parts'}); only one transform slot is rewritten"
    owner = pipeline.owner(dataset)
    if pipeline.kind == "stages":
        if not _is_fastpipe_folder(owner):
            return None, "its stages are declared (fastpipe.stages.Stages): rewrite them in your own __getitem__"
        transform = owner.transform
    elif pipeline.kind == "standard":
        transform = owner.transforms.transform
    else:
        transform = getattr(owner, pipeline.attr)
    leaves, via = inner_leaves(transform)
    return PipelineView(dataset, pipeline, owner, transform, leaves, via), None


def _is_fastpipe_folder(owner: Any) -> bool:
    from fastpipe.datasets.folder import DatasetFolder

    return isinstance(owner, DatasetFolder)


def _replace_owner(obj: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of each wrapper from ``obj`` down to the owner, the owner replaced by ``new`` (the user's objects kept)."""
    if not path:
        return new
    step, rest = path[0], path[1:]
    if isinstance(step, int):
        items = list(obj)
        items[step] = _replace_owner(obj[step], rest, new)
        return tuple(items) if isinstance(obj, tuple) else items
    clone = copy.copy(obj)
    setattr(clone, step, _replace_owner(getattr(obj, step), rest, new))
    return clone


def _with_transform(view: PipelineView, transform: Any) -> Any:
    """The dataset with ``transform`` in the owner's slot (copies; a fastpipe ImageFolder re-plans its fast path)."""
    if _is_fastpipe_folder(view.owner):
        clone = copy.copy(view.owner)
        clone.transform = transform
        return _replace_owner(view.dataset, view.pipeline.path, clone)
    return view.pipeline.with_transform(view.dataset, transform)


def _compose(leaves: Sequence[Any]) -> Any:
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    v2_used = any(type(leaf).__module__.startswith("torchvision.transforms.v2") for leaf in leaves)
    return (v2.Compose if v2_used else v1.Compose)(list(leaves))


def _rewritten(workload: Workload, name: str, dataset: Any = None, device_transform: Any = "same", loader: Any = None) -> Workload:
    new_loader = loader if loader is not None else rebuild_loader(workload.loader, dataset)
    transform = workload.device_transform if device_transform == "same" else device_transform
    return dataclasses.replace(workload, loader=new_loader, device_transform=transform, name=f"{workload.name} + {name}", notes=[])


# --- what the leaves are ----------------------------------------------------------------------------------------


def _float_conversion(leaf: Any) -> str | None:
    """``"pil"`` for a PIL -> float /255 conversion, ``"tensor"`` for a uint8 tensor -> float /255 one, else None."""
    import torch
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    if isinstance(leaf, (v1.ToTensor, v2.ToTensor)) or (type(leaf).__name__ == "MaybeToTensor" and _module(leaf) == "timm"):
        return "pil"
    if isinstance(leaf, v1.ConvertImageDtype) and leaf.dtype == torch.float32:
        return "tensor"
    if isinstance(leaf, v2.ToDtype) and getattr(leaf, "scale", False):
        dtype = leaf.dtype
        if isinstance(dtype, dict):  # {tv_tensors.Image: float32, "others": None}, say: the images' dtype
            from torchvision import tv_tensors

            dtype = dtype.get(tv_tensors.Image, dtype.get(torch.Tensor))
        return "tensor" if dtype == torch.float32 else None
    return None


def _normalize(leaf: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    if isinstance(leaf, (v1.Normalize, v2.Normalize)) and not getattr(leaf, "inplace", False):
        mean, std = (tuple(float(v) for v in (x.tolist() if hasattr(x, "tolist") else x)) for x in (leaf.mean, leaf.std))
        return mean, std
    return None


def _is_pure_tensor(leaf: Any) -> bool:
    import torchvision.transforms.v2 as v2

    return isinstance(leaf, getattr(v2, "ToPureTensor", ()))


def level_unit(workload: Workload, leaves: Sequence[Any]) -> Any:
    """One 0..255 grey level in the units of the images the model gets: per channel after a Normalize, 1/255 after a
    float conversion alone, None (1) for uint8; a device Normalize (fastpipe's, timm's prefetcher's) counts too."""
    from fastpipe.transforms.device import Normalize as DeviceNormalize

    steps = getattr(workload.device_transform, "steps", (workload.device_transform,))
    for step in steps:
        if isinstance(step, TimmPrefetchTransform):
            return [1.0 / s for s in step.std.flatten().tolist()]
        if isinstance(step, DeviceNormalize):
            return [1.0 / (255.0 * s) for s in step.std]
    for leaf in reversed(leaves):
        normalize = _normalize(leaf)
        if normalize is not None:
            return [1.0 / (255.0 * s) for s in normalize[1]]
        if _float_conversion(leaf) is not None:
            return 1.0 / 255.0
    return None


def _uint8_rewrite(leaves: Sequence[Any]) -> tuple[list[Any] | None, tuple[Any, ...] | None, str]:
    """(leaves with the float conversion and Normalize removed, (mean, std), what was moved) or (None, None, why not)."""
    import torchvision.transforms as v1

    for k, leaf in enumerate(leaves):
        kind = _float_conversion(leaf)
        if kind is None:
            continue
        normalize = _normalize(leaves[k + 1]) if k + 1 < len(leaves) else None
        if normalize is None:
            return None, None, f"{type(leaf).__name__} is not followed by a Normalize that could run on the device"
        after = [x for x in leaves[k + 2 :] if not _is_pure_tensor(x)]
        if after:
            return (
                None,
                None,
                (
                    f"{type(after[0]).__name__} follows Normalize: after the copy it would run per batch, "
                    "or see uint8 where it saw floats, so Normalize stays where it is"
                ),
            )
        head = list(leaves[:k]) + ([v1.PILToTensor()] if kind == "pil" else [])
        moved = f"{type(leaf).__name__} + {type(leaves[k + 1]).__name__}"
        return head + list(leaves[k + 2 :]), normalize, moved
    last = type(leaves[-1]).__name__ if leaves else ""
    if last in ("PILToTensor", "MaybePILToTensor", "ToImage"):
        return None, None, f"the transform already ends in uint8 ({last}): the batch crosses the copy as uint8"
    return None, None, "no float conversion (ToTensor, ConvertImageDtype, ToDtype) followed by Normalize in the transform"


def _crop_draws(first: Any, decode: Any) -> tuple[BoxDraw, BoxDraw] | None:
    """The original crop's box draw and the decoder's, when the crop is a RandomResizedCrop (torchvision's or timm's)."""
    if not hasattr(decode, "scale") or not hasattr(type(first), "get_params"):
        return None
    scale, ratio = tuple(first.scale), tuple(first.ratio)

    def original(height: int, width: int) -> Sequence[int]:
        import torch

        shape_only = torch.empty((), dtype=torch.uint8).expand(3, height, width)
        return type(first).get_params(shape_only, scale, ratio)

    def fixed(height: int, width: int) -> Sequence[int]:
        return crop_params(height, width, decode.scale, decode.ratio)

    return original, fixed


def _image_sizes(paths: Sequence[str]) -> list[tuple[int, int]]:
    """(height, width) of up to :data:`SIZE_SAMPLE` files, spread over the dataset, from their headers."""
    from PIL import Image

    step = max(1, len(paths) // SIZE_SAMPLE)
    sizes = []
    for path in list(paths)[::step][:SIZE_SAMPLE]:
        with Image.open(path) as image:
            sizes.append((image.height, image.width))
    return sizes


# --- the candidates ---------------------------------------------------------------------------------------------


def _folder_of(owner: Any) -> tuple[str | None, list[str], str]:
    """(root, file paths, why not) of a dataset the decode-the-crop ImageFolder can replace."""
    import torchvision
    from torchvision.datasets.folder import default_loader, pil_loader

    if _is_fastpipe_folder(owner):
        return None, [], f"it is already fastpipe's {type(owner).__name__} ({owner.fast_path})"
    if isinstance(owner, torchvision.datasets.DatasetFolder):
        if type(owner) not in (torchvision.datasets.ImageFolder, torchvision.datasets.DatasetFolder):
            return None, [], f"{type(owner).__name__} subclasses torchvision's DatasetFolder: its own __getitem__ would be lost"
        if owner.loader not in (default_loader, pil_loader):
            return None, [], "the dataset has a custom loader: fastpipe cannot know what it returns"
        return owner.root, [path for path, _ in owner.samples], ""
    reader = getattr(owner, "reader", None)
    if _module(owner) == "timm" and type(owner).__name__ == "ImageDataset" and hasattr(reader, "samples") and hasattr(reader, "root"):
        if getattr(owner, "load_bytes", False):
            return None, [], "timm's ImageDataset reads bytes (load_bytes=True): the transform does the decoding"
        return os.fspath(reader.root), [os.fspath(path) for path, _ in reader.samples], ""
    return None, [], f"the dataset is a {type(owner).__name__}, not an image folder (torchvision's ImageFolder, timm's ImageDataset)"


def _decode_crop(workload: Workload, view: PipelineView, leaves: list[Any], label: str, device_transform: Any = "same") -> Candidate:
    from fastpipe.datasets import ImageFolder

    name = f"decode only the crop ({label})"
    root, paths, why = _folder_of(view.owner)
    expr = f"<your {view.via}>" if view.via else "the same transform"
    code = f"dataset = fastpipe.datasets.ImageFolder({root!r}, transform={expr})"
    if root is None:
        return Candidate(name, ("raw load",), code, not_tried=f"not absorbed: {why}")
    fast = absorb(_compose(leaves))
    if not fast.active:
        return Candidate(name, ("raw load",), code, not_tried=str(fast))
    dataset = ImageFolder(root, transform=_compose(leaves), target_transform=getattr(view.owner, "target_transform", None))
    new_dataset = _replace_owner(view.dataset, view.pipeline.path, dataset)
    stage_names = ["raw load", *fast.absorbed] + ([view.via.split(".")[0]] if view.via else [])
    draws = _crop_draws(leaves[0], fast.decode)
    crop = facts_for(leaves[0]).crop
    same_rng = crop is not None and crop.rng in ("torch", "none")  # the decoder draws with torchvision's code on torch's RNG
    return Candidate(
        name,
        tuple(stage_names),
        code + f"  # {fast}",
        transform=dataset.transform,
        changes_samples=None if device_transform == "same" else _UINT8_SAMPLES,
        kind="dataset",
        workload=_rewritten(workload, name, new_dataset, device_transform),
        compare_pixels=None if same_rng else f"{type(leaves[0]).__name__} draws its box with another RNG than the decoder's",
        boxes=None if draws is None else (*draws, _image_sizes(paths)),
    )


def _uint8(workload: Workload, view: PipelineView) -> tuple[Candidate, list[Any] | None, Any]:
    from fastpipe.transforms.device import Normalize

    name = "uint8 over the copy, Normalize on the device"
    head, stats, moved = _uint8_rewrite(view.leaves)
    if head is None or stats is None:
        return Candidate(name, (), "", not_tried=moved), None, None
    device_normalize = chain(Normalize(*stats), workload.device_transform)
    mean, std = (tuple(round(v, 4) for v in x) for x in stats)
    code = (
        f"remove {moved} from the transform{' (' + view.via + ')' if view.via else ''}"
        f"{', ending it with PILToTensor()' if head and type(head[-1]).__name__ == 'PILToTensor' else ''}; after the copy: "
        f"images = fastpipe.transforms.Normalize(mean={mean}, std={std})(images)"
    )
    transform = _compose(head)
    new_dataset = _with_transform(view, transform)
    addresses = tuple(n for n in moved.split(" + ")) + ((view.via.split(".")[0],) if view.via else ())
    candidate = Candidate(
        name,
        addresses,
        code,
        workload=_rewritten(workload, name, new_dataset, device_normalize),
        transform=transform,
        changes_samples=_UINT8_SAMPLES,
        kind="dataset",
    )
    return candidate, head, device_normalize


def sweep_counts(cores: int) -> list[int]:
    """The worker counts fix's short ``tune`` sweep may try: 1, 2, 4, ... doubling below the usable cores, then the
    cores. About log2(cores) + 1 settings instead of ``fastpipe tune``'s cores + 2, so the sweep costs a few
    measurements on any machine (2 on 2 cores, 7 on 48); ``fastpipe tune SPEC`` measures every count in between."""
    counts, workers = [], 1
    while workers < cores:
        counts.append(workers)
        workers *= 2
    return counts + [max(1, cores)]


def _prefetch_of(loader: DataLoader) -> int:
    """The loader's prefetch_factor as tune starts from it: its own with workers, DataLoader's default 2 without."""
    return loader.prefetch_factor if loader.num_workers > 0 and loader.prefetch_factor else 2


def tuned_settings(workload: Workload, tuned: TuneResult) -> Candidate:
    """The setting a ``tune`` sweep recommends, as a rewrite of the user's DataLoader call: "not tried" when the loader
    already has it, or when the sweep recommended nothing.

    ``prefetch_factor`` changes only where tune's rules changed it: it sweeps the queue depth only at a worker count
    with workers (batches from N workers arrive in bursts a deeper queue can even out), only deeper while that count
    is short of the device bound, and keeps the smaller queue unless the deeper one is shorter beyond noise.
    """
    loader = workload.loader
    name = "loader settings from tune"
    measured = sorted({(t.num_workers, t.prefetch_factor) for t in tuned.trials if t.measured})
    swept = "(num_workers, prefetch_factor) = " + ", ".join(f"({w}, {p})" for w, p in measured)
    chosen = tuned.recommended
    if chosen is None:
        return Candidate(name, ("workers",), "", not_tried=f"the short tune sweep recommended nothing: {tuned.summary}")
    workers, prefetch = chosen.num_workers, chosen.prefetch_factor
    if (workers, prefetch) == (loader.num_workers, _prefetch_of(loader)):
        return Candidate(
            name,
            ("workers",),
            "",
            not_tried=f"already at tune's choice, num_workers={workers} and prefetch_factor={prefetch} (a short sweep measured: {swept})",
        )
    changes = [f"num_workers {loader.num_workers} -> {workers}"] if workers != loader.num_workers else []
    arguments = [f"num_workers={workers}"]
    if prefetch != _prefetch_of(loader):
        changes.append(f"prefetch_factor {_prefetch_of(loader)} -> {prefetch}")
        arguments.append(f"prefetch_factor={prefetch}")
    name = ", ".join(changes) + " (tune's choice)"
    return Candidate(
        name,
        ("workers",),
        f"DataLoader(..., {', '.join(arguments)})  # tune's choice from a short sweep of {swept}; `fastpipe tune SPEC` measures every count",
        workload=_rewritten(workload, name, loader=rebuild_loader(loader, loader.dataset, num_workers=workers, prefetch_factor=prefetch)),
        direct=True,
        kind="settings",
        compare_pixels=WORKERS_DRAW if workers != loader.num_workers else None,
    )


def _loader_candidates(workload: Workload, tuned: Candidate | None) -> list[Candidate]:
    loader = workload.loader
    out = [] if tuned is None else [tuned]
    if not isinstance(loader, DataLoader):
        return out
    if loader.num_workers > 0:
        from fastpipe.loading.recycle import recycled

        name = "recycled batch memory"
        out.append(
            Candidate(
                name,
                ("collate", "copy"),
                "loader = fastpipe.loading.recycled(loader)  # workers collate into reused shared-memory buffers",
                workload=_rewritten(workload, name, loader=recycled(rebuild_loader(loader, loader.dataset))),
                direct=True,
                kind="recycled",
            )
        )
    return out


def _thread_loader(workload: Workload, decoded: Candidate) -> Candidate:
    from fastpipe.datasets import ThreadLoader

    name = "ThreadLoader over the decode-the-crop dataset"
    loader = workload.loader
    threads = max(1, loader.num_workers)
    collate = custom_collate(loader)
    custom_batches = loader.batch_size is None
    keeps = (", collate_fn=<your collate_fn>" if collate is not None else "") + (
        ", generator=<your generator>" if loader.generator is not None else ""
    )
    order = "batch_sampler=<your batch_sampler>" if custom_batches else f"batch_size={loader.batch_size}, sampler=<your sampler>"
    head, _, rest = decoded.code.partition("  # ")
    also = rest.partition("; and: ")[2]  # the uint8 rewrite of a decode + uint8 dataset: part of this fix too
    code = (
        f"{head}{'; and: ' + also if also else ''}; then: loader = fastpipe.datasets.ThreadLoader(dataset, {order}"
        f"{', drop_last=True' if loader.drop_last else ''}{keeps}, threads={threads}, pin_memory={bool(loader.pin_memory)})"
        f"  # in place of the DataLoader: {threads} decoding thread(s), one process"
    )
    if decoded.workload is None or (loader.batch_size is None and loader.batch_sampler is None):
        return Candidate(name, ("workers",), code, not_tried="it needs the decode-the-crop dataset and a batch_size or batch_sampler")
    dataset = decoded.workload.loader.dataset
    memo = {id(loader.dataset): loader.dataset, id(dataset): dataset}
    try:
        threaded = ThreadLoader(
            dataset,
            batch_size=None if custom_batches else loader.batch_size,
            sampler=None if custom_batches else copy.deepcopy(loader.sampler, dict(memo)),
            batch_sampler=copy.deepcopy(loader.batch_sampler, dict(memo)) if custom_batches else None,
            drop_last=loader.drop_last,
            generator=copy.deepcopy(loader.generator),
            threads=threads,
            pin_memory=loader.pin_memory,
            collate_fn=collate,
        )
    except Exception as exc:  # noqa: BLE001 - the reason is the report's
        return Candidate(name, ("workers",), code, not_tried=f"ThreadLoader refused the dataset: {type(exc).__name__}: {exc}")
    return Candidate(
        name,
        (*decoded.addresses, "workers"),
        code,
        workload=_rewritten(decoded.workload, name, loader=threaded),
        compare_pixels="its threads draw the crops in the order they run",
        direct=True,
        transform=decoded.transform,
        changes_samples=decoded.changes_samples,
        kind="loader",
    )


def _compile_advice(view: PipelineView) -> list[Candidate]:
    out = []
    for leaf in view.leaves:
        if not facts_for(leaf).compile_helps or not callable(leaf):  # a library's transform is already native
            continue
        name = f"compile {type(leaf).__name__}"
        out.append(
            Candidate(
                name,
                (type(leaf).__name__,),
                f"rewrite {type(leaf).__name__}.__call__ as a compiled kernel (Numba @njit(nogil=True), or C++ as fastpipe.ops does)",
                not_tried=(
                    "it is your own Python transform: a compiled kernel is written by hand and checked against it; "
                    "fastpipe does not generate code that claims to be equivalent"
                ),
            )
        )
    return out


def build_candidates(workload: Workload, tuned: Candidate | None = None) -> tuple[list[Candidate], PipelineView | None]:
    """Every fix that applies to ``workload``'s pipeline (tried or not, with why), and the view it was read from.

    ``tuned``: the loader settings a short ``tune`` sweep chose (:func:`tuned_settings`; ``fix`` runs the sweep, since
    building candidates measures nothing); None leaves them out."""
    view, why = view_of(workload)
    candidates: list[Candidate] = []
    if view is None:
        candidates.append(Candidate("rewrite the transform", (), "", not_tried=f"fastpipe could not read the transform: {why}"))
    else:
        uint8, head, device_normalize = _uint8(workload, view)
        decoded = _decode_crop(workload, view, view.leaves, "the same transform")
        candidates += [decoded, uint8]
        best = decoded
        if head is not None and decoded.workload is not None:
            best = _decode_crop(workload, view, head, "and uint8 over the copy, Normalize on the device", device_normalize)
            best.code += f"; and: {uint8.code}"
            candidates.append(best)
        if decoded.workload is not None:
            # a collate_fn of the user's gets the transform's own output: over the uint8 rewrite it would be refused
            keep_floats = custom_collate(workload.loader) is not None and best.changes_samples is not None
            candidates.append(_thread_loader(workload, decoded if keep_floats else best))
        candidates += _compile_advice(view)
    candidates += _loader_candidates(workload, tuned)
    for candidate in candidates:
        candidate.original = workload
        refuse_what_drops(workload, candidate)
    return candidates, view


def refuse_what_drops(workload: Workload, candidate: Candidate) -> None:
    """Mark ``candidate`` "not tried" when its loader cannot keep a setting of the user's (:mod:`._fix_keep`)."""
    if candidate.workload is None or candidate.not_tried is not None:
        return
    why = refusal(workload.loader, candidate.workload.loader, changes_samples=candidate.changes_samples)
    if why is not None:
        discard_candidate_loader(candidate)
        candidate.not_tried, candidate.workload = why, None


def discard_candidate_loader(candidate: Candidate) -> None:
    """End what a candidate's loader started (a ThreadLoader's threads, a copy's workers); never the user's loader."""
    if candidate.workload is None:
        return
    loader = candidate.workload.loader
    if candidate.original is not None and loader is candidate.original.loader:
        return
    discard_loader(loader)
    close = getattr(loader, "close", None)
    if close is not None and not hasattr(loader, "with_dataset"):
        close()


def worker_count_candidates(workload: Workload, counts: Sequence[int]) -> list[Candidate]:
    """One candidate per worker count in ``counts`` other than the loader's own (script mode, where no factory exists for
    a ``tune`` sweep to rebuild the workload from: the counts are measured as rungs, each against the original)."""
    loader = workload.loader
    if not isinstance(loader, DataLoader):
        return []
    out = []
    for workers in sorted(set(counts) - {loader.num_workers}):
        name = f"num_workers {loader.num_workers} -> {workers}"
        prefetch = _prefetch_of(loader) if workers > 0 else None
        candidate = Candidate(
            name,
            ("workers",),
            f"DataLoader(..., num_workers={workers})  # one of the counts 1, 2, 4, ... and the usable cores, each measured",
            workload=_rewritten(
                workload, name, loader=rebuild_loader(loader, loader.dataset, num_workers=workers, prefetch_factor=prefetch)
            ),
            direct=True,
            kind="settings",
            original=workload,
            compare_pixels=WORKERS_DRAW,
        )
        refuse_what_drops(workload, candidate)
        out.append(candidate)
    return out
