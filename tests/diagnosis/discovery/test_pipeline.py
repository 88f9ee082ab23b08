"""Stage discovery (fastpipe.diagnosis.discovery._pipeline): each dataset shape users bring, and the why-not for the rest."""

from __future__ import annotations

import pickle

import torch
import torchvision.transforms as T
from torch.utils.data import ConcatDataset, DataLoader, Subset
from torchvision.datasets import FakeData
from torchvision.datasets.vision import StandardTransform

from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._cache import CachePointDataset
from fastpipe.stages import Stages
from tests.fakes import (
    AddOne,
    DeclaredStages,
    Fast,
    HeldAsDs,
    NoTransformDataset,
    OwnGetitem,
    PlantedDataset,
    SleepBatch,
    Slow,
    ToTensorColumn,
    TransformProperty,
    hf_dataset,
)


class Double:
    """A stage whose output differs from its input, so a cache serving stale values would show."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def served(dataset, point: str, indices=range(3)):
    pipeline, why = find_pipeline(dataset)
    assert pipeline is not None, why
    cached = CachePointDataset(dataset, pipeline, point)
    return [cached[i] for i in indices]


def test_vision_dataset_transform_and_standard_transform() -> None:
    dataset = FakeData(size=4, image_size=(3, 8, 8), transform=T.Compose([T.PILToTensor(), Fast()]))
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == ["PILToTensor", "Fast"] and pipeline.kind == "attribute"
    copy = pipeline.with_transform(dataset, Double())
    assert isinstance(copy.transforms, StandardTransform) and isinstance(copy.transforms.transform, Double)
    assert isinstance(dataset.transforms.transform, T.Compose)  # the user's dataset untouched


def test_standard_transform_alone() -> None:
    class OnlyJoint(PlantedDataset):
        def __getitem__(self, index):
            x, y = self.transforms(torch.full(self.shape, float(index % 7)), index % 10)
            return x, y

    dataset = OnlyJoint(transform=None)
    dataset.transforms = StandardTransform(T.Compose([Fast(), Double()]), None)
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.kind == "standard" and pipeline.names() == ["Fast", "Double"]
    assert [x[0, 0, 0].item() for x, _ in served(dataset, "after:Fast")] == [0.0, 0.0, 0.0]  # one capture, Double rerun
    assert [x[0, 0, 0].item() for x, _ in served(dataset, "raw")] == [0.0, 0.0, 0.0]


def test_subset_and_wrappers_under_usual_names() -> None:
    inner = PlantedDataset(transform=T.Compose([Fast(), Slow(1)]))
    for wrapped, path in [
        (Subset(inner, [3, 4]), ("dataset",)),
        (HeldAsDs(inner), ("ds",)),
        (HeldAsDs(Subset(inner, [1])), ("ds", "dataset")),
    ]:
        pipeline, why = find_pipeline(wrapped)
        assert why is None and pipeline.path == path and pipeline.names() == ["Fast", "Slow"]


def test_one_attribute_holding_a_dataset_is_followed() -> None:
    class Holder(torch.utils.data.Dataset):
        def __init__(self, source):
            self.name, self.source, self.sizes = "holder", source, [1, 2]

        def __len__(self):
            return len(self.source)

        def __getitem__(self, index):
            return self.source[index]

    pipeline, why = find_pipeline(Holder(PlantedDataset(transform=T.Compose([Fast()]))))
    assert why is None and pipeline.path == ("source",)

    class TwoHeld(Holder):
        def __init__(self, a, b):
            super().__init__(a)
            self.other = b

    pipeline, why = find_pipeline(TwoHeld(PlantedDataset(transform=Fast()), PlantedDataset(transform=Fast())))
    assert pipeline is None and ".source, .other" in why and "`.dataset`" in why


def test_concat_dataset_matches_stages_by_name_and_caches_each_part() -> None:
    first = PlantedDataset(length=5, transform=T.Compose([Fast(), AddOne()]))
    second = PlantedDataset(length=5, transform=T.Compose([Fast(), Double()]))
    pipeline, why = find_pipeline(ConcatDataset([first, second]))
    assert pipeline is None and "parts' stages differ" in why and "AddOne" in why and "Double" in why

    first = PlantedDataset(length=5, transform=T.Compose([Fast(), Double()]))
    second = PlantedDataset(
        length=5,
        transform=T.Compose(
            [
                Fast(),
                Double(),
            ]
        ),
    )
    second.transform.transforms[1] = type("Double", (), {"__call__": lambda self, x: x * 3})()  # same name, other work
    concat = ConcatDataset([first, second])
    pipeline, why = find_pipeline(concat)
    assert why is None and pipeline.names() == ["Fast", "Double"] and len(pipeline.parts) == 2
    # index 3 is in the first part (x = 3 -> 6), index 8 is the second part's 3 (x = 3 -> 9): each part reruns its own stage
    for point in ("raw", "after:Fast"):
        cached = CachePointDataset(concat, pipeline, point, pool=2)
        values = [cached[i][0][0, 0, 0].item() for i in (3, 8, 3, 8)]
        assert values == [6.0, 9.0, 6.0, 9.0], point
    baseline = CachePointDataset(concat, pipeline, "baseline")
    assert [baseline[i][0][0, 0, 0].item() for i in (3, 8)] == [6.0, 9.0]
    assert isinstance(first.transform.transforms[1], Double)  # the user's parts untouched


def test_property_transform_is_looked_through_and_never_leaks() -> None:
    inner = PlantedDataset(transform=T.Compose([Fast(), Slow(1)]))
    wrapper = TransformProperty(inner)
    pipeline, why = find_pipeline(wrapper)
    assert why is None and pipeline.path == ("inner",) and pipeline.names() == ["Fast", "Slow"]
    loader = DataLoader(CachePointDataset(wrapper, pipeline, "raw"), batch_size=2, num_workers=0)
    next(iter(loader))
    baseline = CachePointDataset(wrapper, pipeline, "baseline")
    baseline[0]
    assert isinstance(inner.transform, T.Compose) and [type(t).__name__ for t in inner.transform.transforms] == ["Fast", "Slow"]
    again, _ = find_pipeline(wrapper)
    assert again.names() == ["Fast", "Slow"] and "_Recorder" not in repr(again)


def test_property_without_inner_dataset_says_what_to_change() -> None:
    class Opaque(torch.utils.data.Dataset):
        def __init__(self):
            self._parts = {"main": PlantedDataset(transform=Fast())}

        @property
        def transform(self):
            return self._parts["main"].transform

    pipeline, why = find_pipeline(Opaque())
    assert pipeline is None and "through a property" in why and "self.dataset = inner" in why


def test_declared_stages_split_a_custom_getitem() -> None:
    dataset = DeclaredStages(steps=[Fast(), Double(), AddOne()])
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.kind == "stages" and pipeline.names() == ["Fast", "Double", "AddOne"]
    expected = [dataset[i][0] for i in range(2)]
    for point in ("raw", "after:Fast", "after:Double"):
        values = served(dataset, point, [0, 1, 0])
        assert all(torch.equal(v[0], expected[0]) for v in values), point  # one capture, rerun without piling up
    assert isinstance(dataset.stages, Stages) and dataset.stages.load == dataset.read


def test_the_hint_for_a_custom_getitem_leads_to_a_working_split() -> None:
    # issue 14, item 3: a hint must lead to something that works; the hint names fastpipe.stages.Stages
    pipeline, why = find_pipeline(HeldAsDs(OwnGetitem(steps=[Fast(), Double()])))
    assert pipeline is None
    assert "HeldAsDs -> HeldAsDs.ds (OwnGetitem)" in why
    assert "self.stages = fastpipe.stages.Stages(load=" in why and "OwnGetitem.__getitem__" in why
    followed = HeldAsDs(DeclaredStages(steps=[Fast(), Double()]))  # OwnGetitem with the hint applied
    pipeline, why = find_pipeline(followed)
    assert why is None and pipeline.names() == ["Fast", "Double"]
    batch = next(iter(DataLoader(CachePointDataset(followed, pipeline, "after:Fast"), batch_size=4, num_workers=2)))
    # the first batch comes from worker 0, which captured index 0 and serves it for every index
    assert torch.equal(batch[0], torch.stack([followed[0][0]] * 4)) and batch[1].tolist() == [0] * 4


def test_unsplittable_shapes_say_what_was_found() -> None:
    _, why = find_pipeline(NoTransformDataset())
    assert "no stages found" in why and "fastpipe.stages.Stages" in why
    _, why = find_pipeline(PlantedDataset(transform=None))
    assert "`transform` is None" in why

    class Joint(PlantedDataset):
        transforms = staticmethod(lambda image, target: (image, target))

    joint = Joint(transform=None)
    joint.transforms = Joint.transforms
    _, why = find_pipeline(joint)
    assert "transforms(image, target)" in why and "transform=" in why


def test_hugging_face_set_transform() -> None:
    dataset = hf_dataset(transform=ToTensorColumn())
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.kind == "hf" and pipeline.names() == ["ToTensorColumn"]
    expected = dataset[2]
    for point in ("raw", "baseline"):
        cached = CachePointDataset(dataset, pipeline, point, pool=3)
        rows = [cached[i] for i in range(3)]
        assert torch.equal(rows[2]["x"], expected["x"]) and rows[2]["label"] == expected["label"], point
    assert isinstance(dataset.format["format_kwargs"]["transform"], ToTensorColumn)  # the user's dataset untouched


def test_hugging_face_stages_of_batch_functions_are_split() -> None:
    dataset = hf_dataset(transform=Stages(transforms=[SleepBatch(0), ToTensorColumn()]))
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == ["SleepBatch", "ToTensorColumn"]
    cached = CachePointDataset(dataset, pipeline, "after:SleepBatch")
    assert torch.equal(cached[0]["x"], dataset[0]["x"]) and torch.equal(cached[5]["x"], dataset[0]["x"])


def test_hugging_face_without_transform_says_how() -> None:
    _, why = find_pipeline(hf_dataset())
    assert "with_transform(preprocess)" in why


def test_pipelines_pickle_for_spawned_workers() -> None:
    concat = ConcatDataset(
        [PlantedDataset(length=4, transform=T.Compose([Fast()])), PlantedDataset(length=4, transform=T.Compose([Fast()]))]
    )
    pipeline, _ = find_pipeline(concat)
    cached = pickle.loads(pickle.dumps(CachePointDataset(concat, pipeline, "raw")))
    assert cached[5][1] == 1


def test_joint_transform_on_the_class_is_reported() -> None:
    class Joint(PlantedDataset):
        transforms = staticmethod(lambda image, target: (image, target))

    pipeline, why = find_pipeline(Joint(transform=None))
    assert pipeline is None and "transforms(image, target)" in why


def test_an_indexable_non_dataset_under_a_usual_name_does_not_stop_the_search() -> None:
    class Table:
        def __getitem__(self, key):
            return key

    class Wrapper(torch.utils.data.Dataset):
        def __init__(self, inner):
            self.dataset, self.ds = Table(), inner  # .dataset is tried first, and holds no stages

        def __getitem__(self, index):
            return self.ds[index]

    pipeline, why = find_pipeline(Wrapper(PlantedDataset(transform=T.Compose([Fast()]))))
    assert why is None and pipeline.path == ("ds",)
