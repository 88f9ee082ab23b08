"""The shape of a batch, read through the containers users collate into (tuples, lists, dicts, WebDataset's lists of
samples): how many rows a cached or replayed batch has."""

from __future__ import annotations

from typing import Any


def leading_size(batch: Any) -> int | None:
    """The first dimension of a batch's first array (:func:`first_shape`), or None."""
    shape = first_shape(batch)
    return None if shape is None else shape[0]


def first_shape(batch: Any) -> tuple[int, ...] | None:
    """The shape of a batch's first array of at least one dimension (a tensor or NumPy array, through tuples, lists and
    dicts), top-level columns before nested ones: a column nested in a list may be a list of samples (WebDataset's
    collation keeps tuples that way), whose arrays have no batch dimension, while a top-level array is stacked."""
    level = [batch]
    while level:
        for item in level:
            shape = getattr(item, "shape", None)
            if isinstance(shape, tuple) and len(shape) > 0 and not isinstance(item, (list, tuple, dict)):  # torch.Size is one
                return tuple(int(size) for size in shape)
        level = [
            part for item in level if isinstance(item, (list, tuple, dict)) for part in (item.values() if isinstance(item, dict) else item)
        ]
    return None
