"""The article's toy image-classification workload: dataset, naive transforms, training, variants."""

from fastpipe.workloads.toy.dataset import FakeDataset, FastFakeDataset
from fastpipe.workloads.toy.naive import ConvertColor, RandomMask, Scale, naive_transform
from fastpipe.workloads.toy.optimized import (  # noqa: E402  (importing registers the optimized variants)
    VARIANT_OPTIMIZATIONS,
    Optimizations,
    make_optimized,
    make_toy_variant,
    optimized_transform,
)
from fastpipe.workloads.toy.training import build_model, build_training, make_train_step
from fastpipe.workloads.toy.workloads import VARIANTS, make_naive, make_workload, register_variant

__all__ = [
    "FakeDataset",
    "FastFakeDataset",
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
    "Optimizations",
    "VARIANT_OPTIMIZATIONS",
    "optimized_transform",
    "make_toy_variant",
    "make_optimized",
]

from fastpipe.workloads.toy import ray as _ray_toy  # noqa: E402,F401  (registers toy:ray; imports ray only when it is built)
