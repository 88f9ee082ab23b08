"""The duplicate-stream check on planted streams, and what it costs: 2 workers, 32 items drawn from each.

    python benchmarks/stream_duplicates.py [--diagnose]

Four streams: an IterableDataset that does not split its source by worker, the same split with get_worker_info(),
a WebDataset chain without split_by_worker (4 shards of 10 samples, a random map after to_tuple) and the same chain
with it. Each prints the report's stream section (the check ``fastpipe diagnose`` runs on every stream) and the
seconds it took. ``--diagnose`` also runs the whole diagnosis on the unsharded stream and prints its stream section.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fastpipe.diagnosis  # noqa: E402


class Unsharded(IterableDataset):
    def __iter__(self):
        for i in range(1000):
            yield torch.full((3, 8, 8), float(i)), i % 10


class Sharded(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, 1000, step):
            yield torch.full((3, 8, 8), float(i)), i % 10


def jitter(sample: tuple) -> tuple:
    return sample[0] + f" {torch.rand(1).item():.6f}", sample[1]


def chain(urls: list[str], split: bool):
    import webdataset as wds

    steps = [wds.SimpleShardList(urls), *([wds.split_by_worker] if split else []), wds.tarfile_to_samples()]
    return wds.DataPipeline(*steps, wds.decode(), wds.to_tuple("txt", "cls"), wds.map(jitter))


def shards(folder: str) -> list[str]:
    import webdataset as wds

    urls = []
    for s in range(4):
        url = os.path.join(folder, f"shard-{s}.tar")
        with wds.TarWriter(url) as sink:
            for k in range(10):
                sink.write({"__key__": f"{s}_{k:02d}", "txt": f"shard {s} item {k}", "cls": k})
        urls.append(url)
    return urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diagnose", action="store_true")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as folder:
        urls = shards(folder)
        cases = [
            ("IterableDataset, no worker sharding", DataLoader(Unsharded(), batch_size=8, num_workers=2)),
            ("IterableDataset, get_worker_info() sharding", DataLoader(Sharded(), batch_size=8, num_workers=2)),
            ("WebDataset chain, no split_by_worker", DataLoader(chain(urls, False), batch_size=None, num_workers=2)),
            ("WebDataset chain, split_by_worker", DataLoader(chain(urls, True), batch_size=None, num_workers=2)),
        ]
        for name, loader in cases:
            check = fastpipe.diagnosis.check_stream(loader)
            print(f"\n== {name}: the check took {check.seconds:.2f} s")
            print("\n".join(check.lines()))
    if args.diagnose:
        report = fastpipe.diagnose(
            DataLoader(Unsharded(), batch_size=8, num_workers=2),
            lambda b: None,
            device="sim:20",
            options=fastpipe.DiagnoseOptions(budget=3, progress=False, stage_costs=False, loader_memory=False, startup=False),
        )
        print("\n== fastpipe.diagnose on the unsharded stream, its stream section:")
        print("\n".join(report.streams.lines()))
    print(f"\nload at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
