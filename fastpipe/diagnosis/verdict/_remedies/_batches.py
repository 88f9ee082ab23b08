"""The remedies for what happens to whole batches: collate and IPC, the host-to-device copy, too few workers, and
the stages a ThreadLoader times itself.

These never depend on what one transform is, only on what the pipeline hands out (uint8 or float, by the catalog's
facts) and on what the loader already does (:class:`~fastpipe.diagnosis.verdict._loader.LoaderFacts`), so that no
advice tells a loader to do what it does already.
"""

from __future__ import annotations

import math

from fastpipe.diagnosis.ladder._loader_stages import LoaderStageCosts
from fastpipe.diagnosis.verdict import _fits
from fastpipe.diagnosis.verdict._loader import LoaderFacts
from fastpipe.diagnosis.verdict._remedies._base import Advice
from fastpipe.diagnosis.verdict._remedies._pipeline import floats, label, ships_uint8
from fastpipe.diagnosis.verdict._remedies._probes import prepare_line, progressive
from fastpipe.diagnosis.verdict._remedies._snippets import PAYLOAD_SNIPPET, PREFETCH_SNIPPET, RECYCLED_LINES, TUNE_SNIPPET

#: The ThreadLoader remedy, for a JPEG folder read by fastpipe's ImageFolder whose crop is decoded by DecodeCrop.
THREAD_LOADER = (
    "no worker processes at all for this JPEG folder: fastpipe.datasets.ThreadLoader(dataset, batch_size=..., shuffle=True, "
    "threads=<cores>) decodes whole batches with threads in one process, with no per-sample Python, collate or copies "
    "between processes, one copy of the dataset and no /dev/shm (bench_jpeg.py --thread-loader compares it with the DataLoader)"
)


def thread_loader_fits(dataset: object | None) -> bool:
    """fastpipe's ImageFolder with its crop absorbed into a DecodeCrop: what the ThreadLoader's batch op decodes."""
    folder = _fits.folder(dataset)
    if not type(folder).__module__.startswith("fastpipe.datasets"):
        return False
    from fastpipe.datasets.crop import DecodeCrop

    return isinstance(getattr(getattr(folder, "fast_path", None), "decode", None), DecodeCrop)


def normalize_where(loader: LoaderFacts) -> str:
    """Where a Normalize taken out of the workers runs: after the copy, or in a CPU step on whole batches."""
    return "on the device" if loader.copies else "in the training step, on whole batches"


def collate(transform: object | None, dataset: object | None = None, loader: LoaderFacts | None = None) -> Advice:
    """Collate/IPC: send fewer bytes (uint8 unless the pipeline ships it already), reuse batch memory."""
    loader = loader or LoaderFacts()
    floated = [label(leaf) for leaf in floats(transform)]
    recycled = _recycled_available()
    send = (
        "the images are uint8 already, so: smaller dtypes for the rest, no padding, a lower resolution"
        if ships_uint8(transform)
        else f"uint8 images (PILToTensor, normalize {normalize_where(loader)} with fastpipe.transforms.Normalize), smaller dtypes, no padding"
    )
    summary = f"Collate/IPC: every batch is packed by a worker, passed through shared memory and unpacked. Send less: {send}"
    summary += ", and reuse batch memory with fastpipe.loading.recycled(loader, slots=...)." if recycled else "."
    if thread_loader_fits(dataset):
        summary += f" Or {THREAD_LOADER}."
    caveat = f"your transform ends in {', '.join(floated)}: float32 out, 4x the bytes of uint8" if floated else None
    return Advice(summary=summary, snippet=PAYLOAD_SNIPPET + ("\n" + RECYCLED_LINES if recycled else ""), caveat=caveat)


def _recycled_available() -> bool:
    """Recycled batch memory is a newer part of fastpipe: advise it only where it is there."""
    import importlib.util

    try:
        return importlib.util.find_spec("fastpipe.loading.recycle") is not None
    except (ImportError, ValueError):
        return False


def host_copy(transform: object | None = None, loader: LoaderFacts | None = None) -> Advice:
    """The copy's remedies, less the ones the loader already has (a prefetcher, pinning, uint8 batches)."""
    loader = loader or LoaderFacts()
    if not loader.copies:
        return Advice(summary="Host-to-device copy: this device reads its batches where the loader leaves them; there is no copy.")
    todo, done = [], []
    if loader.pinned:
        done.append("pin_memory=True pins each batch")
    else:
        todo.append("pin_memory=True")
    if loader.prefetcher:
        done.append(f"{loader.prefetcher} copies each batch ahead of the step")
    else:
        todo.append("non_blocking copies on a side stream with fastpipe.DevicePrefetcher")
    if ships_uint8(transform):
        done.append("the pipeline ships uint8 images")
    else:
        todo.append("uint8 payloads (normalize on the device)")
    summary = "Host-to-device copy: " + (f"overlap it with the step and copy less: {', '.join(todo)}." if todo else "")
    if done:
        summary += f" Already in place: {'; '.join(done)}" + (
            "." if todo else ": what is left is the bytes themselves (a lower resolution or smaller dtypes)."
        )
    summary += " fastpipe.loading.recycled(loader) also pins each batch buffer once, so no pin copy runs per batch."
    return Advice(summary=summary.replace(":  ", ": "), snippet=None if loader.prefetcher else PREFETCH_SNIPPET)


def workers() -> Advice:
    """Too few workers: the fewest that keep up, found by ``fastpipe tune``."""
    return Advice(
        summary=(
            "Too few workers: the input is late while the CPU has idle cores. Find the fewest workers that keep up "
            "with `fastpipe tune SPEC` (or fastpipe.tune), which also watches shared memory."
        ),
        snippet=TUNE_SNIPPET,
    )


def recommend_loader_stage(
    costs: LoaderStageCosts,
    dataset: object | None,
    cores: int,
    *,
    threads: int | None = None,
    batch_size: int | None = None,
    saturated: bool = False,
) -> Advice | None:
    """The remedy for an input-bound loader that times its own stages (the ThreadLoader): its dominant stage's.

    The ladder says how much the input costs each step; the loader's clocks say which of its threads spends the
    time, so the advice names that stage: decode (more ``threads=`` while cores are free, ``fastpipe prepare`` for
    progressive JPEGs), read (storage: one thread reads), or the generic path's per-image ``dataset[i]`` and collate.
    None when no stage was timed. ``threads`` is the loader's setting (the native threads in all, which the clocks
    also count); more threads help only up to twice the batch size (two decoding threads) and the cores, and not at all when
    the CPU was ``saturated`` during the baseline (the reading and loop threads need a share of it too).
    """
    top = costs.dominant()
    if top is None:
        return None
    share = "" if math.isnan(top.share_of_step) else f", {top.share_of_step:.0%} of the loop's {costs.step_ms:.1f} ms step"
    per_image = "" if top.ms_per_image is None else f" ({top.ms_per_image:.2f} ms per image)"
    spends = "spend" if top.thread.endswith("threads") else "spends"
    head = f"In the {costs.loader}, {top.stage} dominates: the {top.thread} {spends} {top.ms_per_step:.1f} ms per step on {top.what}{per_image}{share}."
    if top.stage == "decode":
        setting = threads if threads is not None else max(1, round(top.threads or 1.0))
        # two decoding threads, each starting at most one native thread per image of its batch
        useful = min(cores, 2 * batch_size) if batch_size else cores
        off_cpu = (
            "take the decode off the CPU where a GPU decoder is available (fastpipe.datasets.EncodedImageFolder with "
            "DecodeCropOnDevice, as jpeg:device-decode does)."
        )
        if saturated:
            fix = f" The cores were saturated during the run (threads={setting}, {cores} cores here), so more threads will not help; {off_cpu}"
        elif setting < useful:
            fix = (
                f" Give it more native threads: threads={useful} (now {setting}; {cores} cores here, {batch_size or 'n/a'} images a batch)."
            )
        elif useful < cores:  # the batch, not the cores, is the limit
            fix = (
                f" With threads={setting} it already has as many native threads as batches of {batch_size} images can use "
                f"(one per image, two batches at once; {cores} cores here), so more threads will not help; a larger "
                f"batch_size would let more cores decode, or {off_cpu}"
            )
        else:
            fix = f" With threads={setting} it already has the {cores} cores here, so more threads will not help; {off_cpu}"
        return Advice(summary=head + fix + prepare_line(*progressive(dataset)))
    if top.stage == "read":
        return Advice(
            summary=head + " Storage sets the pace: one thread reads the files, so threads= (decoders) cannot help; put the "
            "folder on faster or local storage (a local SSD, or memory when it fits), and a deeper prefetch= only evens out bursts."
        )
    if top.stage == "load + collate":
        return Advice(
            summary=head + " The transform was not absorbed by the batch op, so images are loaded one at a time in the loop's "
            "thread: give fastpipe's ImageFolder size= (or Compose([RandomResizedCrop, RandomHorizontalFlip, PILToTensor]), "
            "normalizing on the device with fastpipe.transforms.Normalize) so whole batches are decoded by threads, or keep "
            "this transform in a DataLoader with workers."
        )
    return Advice(summary=head + " This stage is bookkeeping in Python, not the decode; please report it with this report's JSON.")
