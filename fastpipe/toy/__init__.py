"""The article's toy image-classification workload: dataset, naive transforms, training, variants."""
from fastpipe.toy.dataset import FakeDataset
from fastpipe.toy.naive import ConvertColor, RandomMask, Scale, naive_transform
from fastpipe.toy.training import build_model, build_training, make_train_step
from fastpipe.toy.workloads import VARIANTS, make_naive, make_workload, register_variant

__all__ = [
    "FakeDataset",
    "RandomMask",
    "ConvertColor",
    "Scale",
    "naive_transform",
    "build_model",
    "build_training",
    "make_train_step",
    "VARIANTS",
    "make_naive",
    "make_workload",
    "register_variant",
]
