import pytest
import torch
from torch.utils.data import DataLoader

from fastpipe.devices import parse_device
from fastpipe.errors import ConfigError
from fastpipe.measure import measure_workload
from fastpipe.workload import Workload, load_workload

_LOADER = DataLoader(list(range(8)), batch_size=2)


def make_pair():
    return _LOADER, lambda batch: None


def make_with_device(device):
    return Workload(loader=_LOADER, step=lambda batch: None, name=f"on {device.spec}")


def make_bad():
    return 42


def make_raising():
    raise RuntimeError("boom")


def test_factory_returning_pair() -> None:
    workload = load_workload(f"{__name__}:make_pair", "sim:1")
    assert workload.loader is _LOADER


def test_factory_gets_device() -> None:
    assert load_workload(f"{__name__}:make_with_device", "sim:3").name == "on sim:3"


@pytest.mark.parametrize("name, message", [("make_bad", "must return"), ("make_raising", "raised RuntimeError: boom"), ("missing", "has no function")])
def test_bad_factories(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_workload(f"{__name__}:{name}", "sim:1")


def test_toy_on_cpu_trains_a_real_model(small_toy_options: dict) -> None:
    device = parse_device("cpu")
    workload = load_workload("toy:naive", device, **small_toy_options)
    before = [p.detach().clone() for p in workload.model.parameters()]
    result = measure_workload(workload, device, warmup=1, steps=2)
    assert result.steps_per_s > 0 and len(result.step_times) == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, workload.model.parameters()))


def test_toy_on_sim_builds_no_model(small_toy_options: dict) -> None:
    workload = load_workload("toy:naive", "sim:1", **small_toy_options)
    assert workload.model is None and any("not built" in note for note in workload.notes)


def test_persistent_workers_survive_epochs_and_the_users_loader_still_works() -> None:
    from tests.fakes import PlantedDataset

    loader = DataLoader(PlantedDataset(length=8), batch_size=4, num_workers=1, persistent_workers=True)
    workload = Workload(loader=loader, step=lambda batch: None)
    result = measure_workload(workload, parse_device("sim:1"), warmup=1, steps=6)  # 3 epochs of 2 batches
    assert len(result.step_times) == 6
    assert [batch[1].tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the user's own loop
