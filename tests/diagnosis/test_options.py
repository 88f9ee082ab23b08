"""One options object (issue 40, item 1): the entry points' signatures, the options passed down unchanged, one set of
defaults for Python and the CLI, a ConfigError for what cannot apply, and the old keywords' deprecation path.

Nothing here measures: the engine is stopped where it receives its options (a planted runner, or the private
``run_*`` function the public one calls).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import fastpipe
from fastpipe._deprecated import moved_keywords
from fastpipe.cli import build_parser
from fastpipe.commands.common import diagnose_options_from, measure_options_from
from fastpipe.diagnosis import _diagnose
from fastpipe.diagnosis._options import DiagnoseOptions, MeasureOptions, TrainState
from fastpipe.errors import ConfigError
from fastpipe.experiments import _fix
from fastpipe.experiments._compare import compare
from fastpipe.experiments._fix import fix
from fastpipe.experiments._tune import tune
from fastpipe.workloads._workload import Workload
from tests.fakes import PlantedDataset

ENTRY_POINTS = {"diagnose": _diagnose.diagnose, "compare": compare, "tune": tune, "fix": fix}


class Stop(Exception):
    """Raised where the engine received its arguments: nothing is measured."""


def loader() -> DataLoader:
    return DataLoader(PlantedDataset(length=8), batch_size=4)


def step(batch) -> None:
    return None


@pytest.fixture()
def engine(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """``diagnose``'s engine replaced by one that records (workload, device, options) and stops."""
    calls: list[tuple] = []

    def run_diagnosis(workload, device, options, **kwargs):
        calls.append((workload, device, options))
        raise Stop

    monkeypatch.setattr(_diagnose, "run_diagnosis", run_diagnosis)
    return calls


# ----- the signatures -------------------------------------------------------------------------------------------
def test_each_entry_point_takes_its_source_then_keywords_with_one_options_object() -> None:
    for name, function in ENTRY_POINTS.items():
        params = inspect.signature(function).parameters
        assert len(params) <= 12 and list(params)[:1] in (["loader"], ["source"], ["specs"]), (name, list(params))
        assert params["device"].kind is inspect.Parameter.KEYWORD_ONLY and params["options"].kind is inspect.Parameter.KEYWORD_ONLY
        assert not {"steps", "warmup", "budget", "precision", "runner", "candidates"} & set(params), (name, list(params))
    assert len(inspect.signature(_diagnose.diagnose).parameters) <= 8


# ----- one options object, passed down --------------------------------------------------------------------------
def test_the_engine_gets_the_very_options_object_given(engine: list[tuple]) -> None:
    options = DiagnoseOptions(steps=4, budget=2.0, startup=False)
    with pytest.raises(Stop):
        fastpipe.diagnose(loader(), step, device="sim:5", options=options)
    assert engine[0][2] is options and engine[0][1].spec == "sim:5"


def test_the_runner_is_built_with_the_options_object(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def runner(workload, device, **kwargs):
        seen.update(kwargs)
        raise Stop

    options = DiagnoseOptions(steps=4, pool=3, progress=False)
    with pytest.raises(Stop):
        _diagnose.run_diagnosis(Workload(loader=loader(), step=step), "sim:5", options, runner=runner)
    assert seen == {"options": options, "pool": 3, "progress": False}


def test_measure_options_given_to_diagnose_keep_their_knobs_and_take_the_diagnosis_defaults(engine: list[tuple]) -> None:
    with pytest.raises(Stop):
        fastpipe.diagnose(loader(), step, options=MeasureOptions(steps=7, precision=0.1))
    assert engine[0][2] == DiagnoseOptions(steps=7, precision=0.1)


def test_a_bad_knob_fails_when_the_options_are_built() -> None:
    with pytest.raises(ConfigError, match="--steps"):
        MeasureOptions(steps=0)
    with pytest.raises(ConfigError, match="--strategy"):
        DiagnoseOptions(strategy="random")
    with pytest.raises(ConfigError, match="--budget"):
        dataclasses.replace(DiagnoseOptions(), budget=0)  # validated again on every change
    with pytest.raises(ConfigError, match="DiagnoseOptions"):
        fastpipe.diagnose(loader(), step, options={"steps": 4})


# ----- one set of defaults --------------------------------------------------------------------------------------
def test_the_command_line_defaults_are_the_python_defaults() -> None:
    parser = build_parser()
    parsed = diagnose_options_from(parser.parse_args(["diagnose", "toy:naive"]))
    assert dataclasses.replace(parsed, progress=True) == DiagnoseOptions()  # the bar also needs a terminal
    assert DiagnoseOptions().loader_memory and DiagnoseOptions().startup  # the passes `fastpipe diagnose` runs
    for command in (["compare", "toy"], ["tune", "toy:naive"], ["fix", "toy:naive"]):
        assert measure_options_from(parser.parse_args(command)) == MeasureOptions(), command
    assert inspect.signature(compare).parameters["memory"].default is True  # `fastpipe compare` reads each rung's memory


def test_every_measuring_command_has_the_same_measure_flags() -> None:
    parser = build_parser()
    for command in (["diagnose", "toy:naive"], ["compare", "toy"], ["tune", "toy:naive"], ["fix", "toy:naive"]):
        args = parser.parse_args([*command, "--steps", "5", "--warmup", "1", "--budget", "4", "--precision", "0.1"])
        assert measure_options_from(args) == MeasureOptions(steps=5, warmup=1, budget=4.0, precision=0.1), command


# ----- what cannot apply ----------------------------------------------------------------------------------------
def test_what_a_workload_carries_cannot_be_given_beside_it(engine: list[tuple]) -> None:
    workload = Workload(loader=loader(), step=step)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="train_state cannot be given with a Workload"):
        fastpipe.diagnose(workload, train_state=TrainState(model=model))
    with pytest.raises(ConfigError, match="step cannot be given with a Workload"):
        fastpipe.diagnose(workload, step)
    with pytest.raises(ConfigError, match="device_transform, prefetch_depth"):
        fastpipe.diagnose(workload, device_transform=lambda b: b, prefetch_depth=2)
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="train_state"):
        fastpipe.diagnose(workload, model=model)  # the old keyword was silently ignored with a Workload
    with pytest.raises(ConfigError, match="step cannot be given with a Workload"):
        tune(workload, step=step)
    assert not engine


# ----- the old keywords, for one release -----------------------------------------------------------------------
def test_an_old_diagnose_call_warns_and_means_the_same(engine: list[tuple]) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    the_loader = loader()
    with pytest.warns(DeprecationWarning) as caught, pytest.raises(Stop):
        fastpipe.diagnose(the_loader, step, "sim:5", steps=4, budget=2.0, startup=False, name="old", model=model, optimizer=optimizer)
    messages = [str(w.message) for w in caught]
    assert any("pass it by keyword" in m and "device=" in m for m in messages), messages
    assert any("options=DiagnoseOptions(steps=..., budget=..., startup=..., name=...)" in m for m in messages), messages
    assert any("train_state=TrainState(model=..., optimizer=...)" in m for m in messages), messages
    old_workload, old_device, old_options = engine.pop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns about nothing
        with pytest.raises(Stop):
            fastpipe.diagnose(
                the_loader,
                step,
                device="sim:5",
                options=DiagnoseOptions(steps=4, budget=2.0, startup=False, name="old"),
                train_state=TrainState(model=model, optimizer=optimizer),
            )
    new_workload, new_device, new_options = engine.pop()
    assert old_options == new_options and old_device.spec == new_device.spec
    assert (old_workload.model, old_workload.optimizer) == (new_workload.model, new_workload.optimizer) == (model, optimizer)


def test_old_keywords_fold_into_the_options_given(engine: list[tuple]) -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(Stop):
        fastpipe.diagnose(loader(), step, options=DiagnoseOptions(pool=2), threshold=0.1)
    assert engine[0][2] == DiagnoseOptions(pool=2, threshold=0.1)
    # the test seam left the public signature: an unknown keyword is a TypeError, only the moved ones are mapped
    with pytest.raises(TypeError, match="runner"):
        fastpipe.diagnose(loader(), step, runner=None)


def test_old_fix_compare_and_tune_calls_warn_and_map_onto_measure_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []

    def run_fix(source, device, options, **kwargs):
        seen.append((device, options))
        raise Stop

    monkeypatch.setattr(_fix, "run_fix", run_fix)
    with pytest.warns(DeprecationWarning, match=r"options=MeasureOptions\(steps=\.\.\., budget=\.\.\.\)"), pytest.raises(Stop):
        fix("toy:naive", device="sim:5", steps=4, budget=3.0)
    assert seen == [("sim:5", MeasureOptions(steps=4, budget=3.0))]
    with pytest.warns(DeprecationWarning, match="MeasureOptions"), pytest.raises(ConfigError, match="--budget"):
        compare(["toy"], device="sim:5", budget=0)  # mapped, then validated as any options are
    with pytest.warns(DeprecationWarning, match="MeasureOptions"), pytest.raises(ConfigError, match="--steps"):
        tune(loader(), step=step, steps=0)


def test_the_deprecation_helper_maps_positions_and_fields_of_any_dataclass() -> None:
    @dataclasses.dataclass(frozen=True)
    class Knobs:
        a: int = 1
        b: int = 2

    @moved_keywords({"knobs": Knobs}, positional=("where",))
    def entry(source, *, where=None, knobs=None):
        return source, where, knobs

    assert entry(0, where="x") == (0, "x", None)
    with pytest.warns(DeprecationWarning) as caught:
        assert entry(0, "x", a=5) == (0, "x", Knobs(a=5))
    assert [str(w.message) for w in caught] == [
        "entry(): passing where by position is deprecated; pass it by keyword: entry(..., where=...)",
        "entry(a=...) is deprecated; pass knobs=Knobs(a=...)",
    ]
    with pytest.warns(DeprecationWarning):
        assert entry(0, knobs=Knobs(b=7), a=5) == (0, None, Knobs(a=5, b=7))
    with pytest.raises(TypeError, match="positional"):
        entry(0, "x", "y")
    with pytest.raises(TypeError, match="multiple values"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entry(0, "x", where="y")
    assert list(inspect.signature(entry).parameters) == ["source", "where", "knobs"]


def test_a_command_without_the_diagnose_flags_gets_their_defaults() -> None:
    """``fastpipe fix -- python train.py`` runs script mode from a parser with only the measuring flags."""
    args = build_parser().parse_args(["fix", "toy:naive", "--steps", "5"])
    assert dataclasses.replace(diagnose_options_from(args), progress=True) == DiagnoseOptions(steps=5)
