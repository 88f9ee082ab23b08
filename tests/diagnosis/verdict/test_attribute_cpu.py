"""The verdict on the device it ran on (issue 30, item 6): on --device cpu the pipeline competes with the step for the CPU."""

from __future__ import annotations

import torchvision.transforms as T
from torch.utils.data import DataLoader

from fastpipe import diagnose
from fastpipe.devices import parse_device
from fastpipe.diagnosis.verdict._attribute import COMPETES, verdict_for
from tests.fakes import PlantedDataset, Slow, quick_options


def test_the_cpu_verdict_is_its_own_and_the_bands_stay_elsewhere() -> None:
    assert verdict_for(0.35, shares_cores=True) == "the input pipeline competes with the step for the CPU: 35% of the step"
    assert verdict_for(0.35) == "highly input-bound" and verdict_for(0.10) == "moderately input-bound"
    assert verdict_for(0.02, shares_cores=True) == "not input-bound"  # under the first band there is nothing to say
    assert parse_device("cpu").step_uses_worker_cores
    assert not parse_device("sim:10").step_uses_worker_cores


def test_a_cpu_diagnosis_says_the_pipeline_competes_for_the_cpu_and_when_watch_agrees() -> None:
    loader = DataLoader(PlantedDataset(raw_ms=20, transform=T.Compose([Slow(5)])), batch_size=4, num_workers=2)
    report = diagnose(
        loader,
        lambda batch: None,
        device="cpu",
        options=quick_options(steps=3, warmup=1, budget=0.5, threshold=0.15, stage_costs=False),
    )
    assert report.gap_fraction is not None and report.gap_fraction >= 0.05, report.to_table()
    assert report.verdict == f"{COMPETES}: {report.gap_fraction:.0%} of the step" and "input-bound" not in report.verdict
    assert any("fastpipe watch" in c and "accelerator" in c and "agree" in c for c in report.caveats), report.caveats
    assert report.to_dict()["verdict"] == report.verdict
