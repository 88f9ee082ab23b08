"""DevicePrefetcher on CUDA: values match the CPU, the side stream is made once, memory is not reused early;
the side stream waits for batches a loader wrote on the consumer's stream; recycled batch memory is
registered as pinned and a slot goes back only after its copy ran.

Skipped without a GPU. The stress test makes the consumer's stream slow (``torch.cuda._sleep``),
mutates each batch there, then frees it while that work is still queued: if the allocator handed
the memory back to the copy stream (no ``record_stream``), the next copies would overwrite it
and the sums would come out wrong. A control run with ``record_stream`` disabled shows the loop
does detect that. Every other GPU race test here has such a control too: the same loop with the
safeguard switched off must fail.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.loading._prefetch import DevicePrefetcher, make_prefetcher

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# The article's RGB -> YCbCr matrix and offset.
YCBCR = torch.tensor([[0.299, 0.587, 0.114], [-0.16874, -0.33126, 0.5], [0.5, -0.41869, -0.08131]])
OFFSET = torch.tensor([0.0, 128.0, 128.0])


@dataclasses.dataclass
class Meta:
    ids: torch.Tensor
    note: str


def to_ycbcr_float(batch: dict[str, Any]) -> dict[str, Any]:
    """uint8 NCHW -> float YCbCr / 255, elementwise (no TF32 matmul), on whatever device the batch is on."""
    x = batch["image"].float()
    matrix = YCBCR.to(x.device)[None, :, :, None, None]
    y = (matrix * x[:, None]).sum(dim=2) + OFFSET.to(x.device)[None, :, None, None]
    return {**batch, "image": y / 255}


def make_batch(i: int, n: int = 8, side: int = 64) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(i)
    image = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=generator)
    return {"image": image, "label": torch.arange(n) + i, "meta": Meta(torch.tensor([i]), f"b{i}")}


class Images(Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=generator), index


def sleep_cycles(ms: float) -> int:
    """GPU clock cycles that keep the current stream busy for about ``ms``, calibrated on a warmed-up GPU.

    Calibrated on an idle GPU (345 MHz on an H200, 1980 MHz under load) the sleeps would last a sixth of
    ``ms`` once the clock ramps, too short for the controls below to catch a missing safeguard.
    """
    from tests.fakes.gpu_clock import sleep_cycles as warmed_sleep_cycles

    return warmed_sleep_cycles(ms)


@pytest.mark.parametrize("transform", [None, to_ycbcr_float], ids=["copy", "ycbcr"])
def test_values_match_the_cpu(transform: Any) -> None:
    batches = [make_batch(i) for i in range(6)]  # pageable: the prefetcher must pin them itself
    out = list(DevicePrefetcher(batches, "cuda", depth=2, transform=transform))
    torch.cuda.synchronize()
    assert len(out) == len(batches)
    for got, host in zip(out, batches):
        expected = host if transform is None else transform(host)
        assert got["image"].is_cuda and got["label"].is_cuda and got["meta"].ids.is_cuda
        assert got["meta"].note == host["meta"].note
        assert got["image"].dtype == expected["image"].dtype
        if transform is None:
            assert torch.equal(got["image"].cpu(), expected["image"])
        else:  # float maths may round differently on the GPU (FMA), never by more than this
            torch.testing.assert_close(got["image"].cpu(), expected["image"], rtol=1e-5, atol=1e-4)
        assert torch.equal(got["label"].cpu(), expected["label"])
        assert torch.equal(got["meta"].ids.cpu(), expected["meta"].ids)


def test_pinned_dataloader_on_a_consumer_side_stream_keeps_order() -> None:
    loader = DataLoader(Images(), batch_size=5, num_workers=2, pin_memory=True)
    prefetcher = DevicePrefetcher(loader, "cuda", depth=3)
    consumer = torch.cuda.Stream()
    with torch.cuda.stream(consumer):  # the hand-over must sync with whatever stream is current
        epochs = [[(images.long().sum().item(), labels.tolist()) for images, labels in prefetcher] for _ in range(2)]
    expected = [(images.long().sum().item(), labels.tolist()) for images, labels in loader]
    assert epochs == [expected, expected]
    assert len(prefetcher) == len(expected) == 5


def test_one_side_stream_for_every_epoch() -> None:
    prefetcher = DevicePrefetcher([make_batch(i) for i in range(3)], "cuda")
    streams = []
    for _ in range(3):
        for _batch in prefetcher:
            pass
        streams.append(prefetcher.stream)
    assert streams[0] is not None and all(s is streams[0] for s in streams)
    assert streams[0] != torch.cuda.current_stream()


def _stress(record_stream_works: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run the stress loop; return how many batches came out corrupted."""
    if not record_stream_works:
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    size, steps = 1 << 22, 60  # 4 MB uint8 -> 16 MB float per batch
    host = [torch.full((size,), i % 97, dtype=torch.uint8).pin_memory() for i in range(steps)]
    cycles = sleep_cycles(3.0)
    sums = []
    for batch in DevicePrefetcher(host, "cuda", depth=2, transform=lambda b: b.float()):
        torch.cuda._sleep(cycles)  # the "step" is still running when the batch is freed below
        batch.mul_(2)  # mutate it on the consumer stream
        sums.append(batch.sum())
        del batch  # freed now, while the consumer stream has yet to read it
    torch.cuda.synchronize()
    got = torch.stack(sums).cpu()
    expected = torch.tensor([2.0 * size * (i % 97) for i in range(steps)])
    return int((got != expected).sum())


def test_memory_is_not_reused_while_the_consumer_still_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _stress(True, monkeypatch) == 0


def test_the_stress_loop_detects_reuse_without_record_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: torchtnt's gap reproduced. If this fails, the stress loop above proves nothing."""
    assert _stress(False, monkeypatch) > 0


def test_torchtnt_gives_the_same_batches() -> None:
    pytest.importorskip("torchtnt")
    batches = [make_batch(i) for i in range(4)]
    ours = list(make_prefetcher(batches, "cuda", depth=2, transform=to_ycbcr_float, kind="fastpipe"))
    theirs = list(make_prefetcher(batches, "cuda", depth=2, transform=to_ycbcr_float, kind="tnt"))
    torch.cuda.synchronize()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a["image"], b["image"])
        assert torch.equal(a["label"], b["label"])


# -- the side stream reads a loader's CUDA tensors only after the consumer's stream wrote them (issue 12) --


class GpuWrittenBatches:
    """A loader that yields CUDA tensors written on the current stream behind a long sleep there.

    Until the sleep ends the tensor holds whatever the allocator left in that memory, so a side
    stream that reads it without waiting for the current stream sees the wrong values.
    """

    def __init__(self, steps: int, size: int, cycles: int) -> None:
        self.steps, self.size, self.cycles = steps, size, cycles

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Any:
        for i in range(self.steps):
            x = torch.empty(self.size, device="cuda")
            torch.cuda._sleep(self.cycles)
            x.fill_(float(i % 97))
            yield x


def _side_stream_errors(wait_works: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    if not wait_works:
        monkeypatch.setattr(torch.cuda.Stream, "wait_stream", lambda self, stream: None)
    size, steps = 1 << 20, 30
    loader = GpuWrittenBatches(steps, size, sleep_cycles(3.0))
    sums = [batch.sum() for batch in DevicePrefetcher(loader, "cuda", depth=2, transform=lambda b: b * 2)]  # read on the side stream
    torch.cuda.synchronize()
    got = torch.stack(sums).cpu()
    expected = torch.tensor([2.0 * size * (i % 97) for i in range(steps)])
    return int((got != expected).sum())


def test_the_side_stream_waits_for_batches_written_on_the_consumer_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _side_stream_errors(True, monkeypatch) == 0


def test_the_gpu_written_loader_detects_a_missing_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: without the side stream's wait the transform reads unwritten memory. If this fails, the test above proves nothing."""
    assert _side_stream_errors(False, monkeypatch) > 0


# -- recycled batch memory on CUDA (issue 15): registered once, released after the copy event --


class Marked(Dataset):
    """Sample i is a 3x64x64 uint8 image filled with ``i % 200`` (never 255, the poison) and its index."""

    def __len__(self) -> int:
        return 160

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 64, 64), index % 200, dtype=torch.uint8), index


def _wrong_samples(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    expected = (labels % 200).to(images.dtype).view(-1, 1, 1, 1)
    return (images != expected).flatten(1).any(dim=1).sum()


def test_recycled_buffers_are_registered_as_pinned_memory() -> None:
    from fastpipe.devices import parse_device
    from fastpipe.loading.recycle import RecycledLoader

    ring = RecycledLoader(DataLoader(Marked(), batch_size=8, num_workers=2, pin_memory=True), slots=3)
    iterator = ring.iter_for_device(parse_device("cuda"))
    for _ in range(16):
        images, labels = next(iterator)
        assert images.is_pinned() and labels.is_pinned(), "registered with cudaHostRegister: no pinned copy needed"
        assert int(_wrong_samples(images, labels)) == 0
    iterator.close()
    stats = ring.stats()
    assert stats["pinning"] == "register" and stats["reused"] > 0


def _prefetched_ring_errors(honour_event: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """Poisoned slots, a side stream kept busy: a slot released before its copy ran shows as 255 on the GPU."""
    from fastpipe.loading.recycle import RecycledLoader

    if not honour_event:
        original = RecycledLoader.release
        monkeypatch.setattr(RecycledLoader, "release", lambda self, batch, after=None: original(self, batch))
    ring = RecycledLoader(DataLoader(Marked(), batch_size=8, num_workers=2, pin_memory=True), slots=3, poison=255)
    cycles = sleep_cycles(3.0)

    def busy(batch: Any) -> Any:
        torch.cuda._sleep(cycles)  # on the side stream: the next batch's copy queues behind it
        return batch

    wrong = [_wrong_samples(images, labels) for images, labels in DevicePrefetcher(ring, "cuda", depth=2, transform=busy)]
    torch.cuda.synchronize()
    return int(torch.stack(wrong).sum())


def test_a_recycled_slot_goes_back_only_after_its_copy_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _prefetched_ring_errors(True, monkeypatch) == 0


def test_the_poisoned_ring_detects_a_release_before_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: releasing at once instead of after the event lets the poison reach the GPU."""
    assert _prefetched_ring_errors(False, monkeypatch) > 0


def _hand_written_loop_errors(fence_works: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """A loop of its own: ``x.cuda(non_blocking=True)`` queued behind a busy stream, then on to the next batch."""
    from fastpipe.loading.recycle import RecycledLoader

    if not fence_works:
        monkeypatch.setattr(RecycledLoader, "_fence", lambda self: False)
    ring = RecycledLoader(DataLoader(Marked(), batch_size=8, num_workers=2, pin_memory=True), slots=3, poison=255)
    cycles = sleep_cycles(3.0)
    wrong = []
    for images, labels in ring:
        torch.cuda._sleep(cycles)  # the step before; the copy below waits behind it
        wrong.append(_wrong_samples(images.cuda(non_blocking=True), labels.cuda(non_blocking=True)))
    torch.cuda.synchronize()
    return int(torch.stack(wrong).sum())


def test_a_hand_written_loop_releases_after_its_queued_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _hand_written_loop_errors(True, monkeypatch) == 0


def test_the_hand_written_loop_detects_a_release_without_the_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the test above."""
    assert _hand_written_loop_errors(False, monkeypatch) > 0


def test_registration_failure_falls_back_to_pinned_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastpipe.loading.recycle._hostpin as hostpin
    from fastpipe.loading.recycle import RecycledLoader

    monkeypatch.setattr(hostpin, "register", lambda buffer: 1)  # cudaErrorInvalidValue, as a locked-memory limit gives
    ring = RecycledLoader(DataLoader(Marked(), batch_size=8, num_workers=2, pin_memory=True), slots=3, poison=255)
    with pytest.warns(RuntimeWarning, match="could not register"):
        batches = [(images, labels) for images, labels in ring]
    assert all(images.is_pinned() for images, _ in batches)
    assert sum(int(_wrong_samples(images, labels)) for images, labels in batches) == 0  # copies: kept safely
    assert ring.stats()["pinning"].startswith("copied")
