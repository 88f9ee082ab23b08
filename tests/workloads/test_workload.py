import sys
import types

import pytest
import torch
from torch.utils.data import DataLoader

from fastpipe.devices import CpuDevice, Device, default_device_spec, parse_device
from fastpipe.diagnosis.ladder._measure import measure_workload
from fastpipe.errors import ConfigError
from fastpipe.workloads._workload import Workload, default_device_for, load_workload

_LOADER = DataLoader(list(range(8)), batch_size=2)


def make_pair():
    return _LOADER, lambda batch: None


def make_with_device(fastpipe_device):
    return Workload(loader=_LOADER, step=lambda batch: None, name=f"on {fastpipe_device.spec}")


def make_with_model(device):
    """What a user writes first: the model goes where the factory's device says."""
    model = torch.nn.Linear(2, 2).to(device)

    def step(batch):
        model(batch.float().view(-1, 1).expand(-1, 2)).sum().backward()

    return Workload(loader=_LOADER, step=step, model=model, name=f"model on {device}")


def make_with_both(device, fastpipe_device):
    assert isinstance(device, torch.device) and isinstance(fastpipe_device, Device)
    return Workload(loader=_LOADER, step=lambda batch: None, name=f"{device} {fastpipe_device.spec} {fastpipe_device.runs_model}")


def make_bad():
    return 42


def make_raising():
    raise RuntimeError("boom")


def test_factory_returning_pair() -> None:
    workload = load_workload(f"{__name__}:make_pair", "sim:1")
    assert workload.loader is _LOADER


def test_factory_asking_for_fastpipe_device_gets_fastpipes_device() -> None:
    assert load_workload(f"{__name__}:make_with_device", "sim:3").name == "on sim:3"


@pytest.mark.parametrize("spec", ["cpu", "sim:50"])
def test_factory_device_is_a_torch_device_a_model_can_move_to(spec: str) -> None:
    device = parse_device(spec)
    workload = load_workload(f"{__name__}:make_with_model", device)
    assert workload.name == "model on cpu"  # cpu on sim too: the sim step stands in for the model
    assert next(workload.model.parameters()).device == torch.device("cpu")
    assert measure_workload(workload, device, warmup=0, steps=2).steps_per_s > 0


def test_factory_may_ask_for_both_devices() -> None:
    assert load_workload(f"{__name__}:make_with_both", "sim:5").name == "cpu sim:5 False"
    assert load_workload(f"{__name__}:make_with_both", "cpu").name == "cpu cpu True"


def test_a_factory_that_raises_is_told_what_device_is() -> None:
    with pytest.raises(ConfigError, match="torch.device.*fastpipe_device"):
        load_workload(f"{__name__}:make_raising", "sim:1")


TRAIN_PY = """
import torch
from torch.utils.data import DataLoader

def make_workload(device):
    model = torch.nn.Linear(2, 2).to(device)
    return DataLoader(torch.zeros(8, 2), batch_size=2), lambda batch: model(batch).sum().backward()
"""


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A user's folder holding train_cwd_probe.py, made the current directory, with sys.path as a console script has it."""
    (tmp_path / "train_cwd_probe.py").write_text(TRAIN_PY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("train_cwd_probe", None)


def test_a_user_module_is_found_in_the_current_directory(user_folder) -> None:
    workload = load_workload("train_cwd_probe:make_workload", "cpu")
    assert sys.modules["train_cwd_probe"].__file__ == str(user_folder / "train_cwd_probe.py")
    assert sys.path[0] == str(user_folder)
    assert measure_workload(workload, parse_device("cpu"), warmup=0, steps=1).steps_per_s > 0


def test_a_missing_module_says_where_it_was_looked_for(user_folder) -> None:
    with pytest.raises(ConfigError, match="no module 'nothere_xyz' in the current directory .* nothere_xyz.py"):
        load_workload("nothere_xyz:make", "cpu")


def test_a_module_whose_own_import_fails_names_what_it_imports(user_folder) -> None:
    (user_folder / "train_broken_probe.py").write_text("import not_installed_pkg_xyz\n")
    try:
        with pytest.raises(ConfigError, match="importing 'train_broken_probe' failed: No module named 'not_installed_pkg_xyz'"):
            load_workload("train_broken_probe:make", "cpu")
    finally:
        sys.modules.pop("train_broken_probe", None)


def test_jpeg_specs_go_to_the_jpeg_family_with_its_own_sim_step(monkeypatch) -> None:
    calls = []
    fake = types.ModuleType("fastpipe.workloads.jpeg")
    fake.DEFAULT_SIM_SPEC = "sim:222"
    fake.make_workload = lambda variant, device, **options: calls.append((variant, device, options)) or Workload(loader=_LOADER, step=print)
    monkeypatch.setitem(sys.modules, "fastpipe.workloads.jpeg", fake)
    load_workload("jpeg:naive", "cpu", batch_size=4)
    assert calls[0][0] == "naive" and isinstance(calls[0][1], CpuDevice) and calls[0][2] == {"batch_size": 4}
    expected = default_device_spec() if torch.cuda.is_available() else "sim:222"
    assert default_device_for("jpeg:naive") == expected
    load_workload("jpeg:naive")  # no device: the family's own default
    assert calls[1][1].spec == expected
    assert default_device_for("toy:naive") == default_device_spec()  # toy as it always was
    assert default_device_for(["jpeg:naive", "toy:naive"]) == default_device_spec()  # no single family default
    assert default_device_for("mypkg.train:make") == default_device_spec()


def test_jpeg_specs_without_the_jpeg_family_are_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "fastpipe.workloads.jpeg", None)  # as if fastpipe/jpeg were absent
    with pytest.raises(ConfigError, match="'jpeg:' workloads need fastpipe.workloads.jpeg"):
        load_workload("jpeg:naive", "cpu")


def test_options_are_only_for_built_in_workloads() -> None:
    with pytest.raises(ConfigError, match="only apply to the built-in workloads"):
        load_workload(f"{__name__}:make_pair", "sim:1", batch_size=3)


@pytest.mark.parametrize(
    "name, message", [("make_bad", "must return"), ("make_raising", "raised RuntimeError: boom"), ("missing", "has no function")]
)
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


def test_the_real_jpeg_family_asks_for_its_own_sim_step() -> None:
    jpeg = pytest.importorskip("fastpipe.workloads.jpeg")
    expected = default_device_spec() if torch.cuda.is_available() else jpeg.DEFAULT_SIM_SPEC
    assert default_device_for("jpeg:naive") == default_device_for("jpeg") == expected
