"""DevicePrefetcher on CUDA: values match the CPU, the side stream is made once, memory is not reused early.

Skipped without a GPU. The stress test makes the consumer's stream slow (``torch.cuda._sleep``),
mutates each batch there, then frees it while that work is still queued: if the allocator handed
the memory back to the copy stream (no ``record_stream``), the next copies would overwrite it
and the sums would come out wrong. A control run with ``record_stream`` disabled shows the loop
does detect that.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.prefetch import DevicePrefetcher, make_prefetcher

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
    """GPU clock cycles that ``torch.cuda._sleep`` needs to keep the current stream busy for ``ms``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 10_000_000
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * ms / max(start.elapsed_time(end), 1e-3))


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
