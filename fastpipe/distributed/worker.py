"""What runs inside the Ray tasks: read samples by index, run the CPU transforms, collate, ship columns.

Each task turns one row, one training batch's indices, into one block: the loader's own
``collate_fn`` output, flattened into columns (one per tensor, uint8 images stay uint8).
Ray keeps those as Arrow tensor columns in its object store, and the trainer reads them back
without a copy.

The dataset is sent to the cluster once (``ray.put``) and unpickled once per Ray worker process,
then kept there, keyed by its loader's token, like a DataLoader worker keeps its dataset. Ray
reuses its worker processes across tasks and epochs, so this costs what one DataLoader epoch's
worker start-up costs, once. It is also what makes fastpipe's cache points work on Ray: a
wrapped dataset that caches a sample caches it per worker process.

Random transforms are seeded per batch from a per-epoch base seed, which the driver draws from
torch's generator as a DataLoader does: batches differ from each other and between epochs, and
``torch.manual_seed`` in the training script makes a run repeatable, wherever the tasks run.
"""

from __future__ import annotations

import pickle
import random
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import torch
from torch.utils import _pytree as pytree

#: Marks the line of a task's error message that says what failed, for the driver to find.
ERROR_PREFIX = "[fastpipe ray task: "
#: The column holding the pickled structure (pytree spec) of the collated batch.
SPEC_COLUMN = "__fastpipe_spec__"
_MAX_DATASETS = 8
_datasets: "OrderedDict[str, Any]" = OrderedDict()


class TaskError(RuntimeError):
    """A sample, transform or collate failed inside a Ray task. One string argument, so it pickles anywhere."""

    @classmethod
    def wrap(cls, where: str, exc: BaseException) -> "TaskError":
        detail = str(exc) if type(exc).__name__ == "StageError" else f"{type(exc).__name__}: {exc}"
        return cls(f"{ERROR_PREFIX}{where}] {detail}")


def dataset_for(token: str, source: Any) -> Any:
    """The dataset of the loader ``token`` in this worker process: fetched and unpickled once, then kept."""
    dataset = _datasets.get(token)
    if dataset is None:
        import ray

        dataset = ray.get(source) if isinstance(source, ray.ObjectRef) else source
        _datasets[token] = dataset
        while len(_datasets) > _MAX_DATASETS:  # a diagnosis builds a few loaders; keep the newest
            _datasets.popitem(last=False)
    else:
        _datasets.move_to_end(token)
    return dataset


def seed_batch(base_seed: int, batch_number: int) -> None:
    """Seed numpy, torch and ``random`` for one batch, distinctly per (epoch seed, batch)."""
    sequence = np.random.SeedSequence([int(base_seed), int(batch_number)])
    np.random.seed(sequence.generate_state(4))
    seed = int(sequence.generate_state(1, dtype=np.uint64)[0])
    torch.manual_seed(seed)
    random.seed(seed)


def to_columns(batch: Any, rows: int) -> dict[str, Any]:
    """A collated batch as named columns: one array per tensor (leading dimension ``rows``), plus its structure."""
    leaves, spec = pytree.tree_flatten(batch)
    columns: dict[str, Any] = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            array = leaf.detach().cpu().numpy()
        elif isinstance(leaf, np.ndarray):
            array = leaf
        else:
            raise TypeError(
                f"the collated batch holds a {type(leaf).__name__} (leaf {i}); fastpipe's Ray loader ships tensors and "
                "NumPy arrays only: make the dataset return tensors, or the collate_fn turn other values into tensors"
            )
        if array.ndim == 0 or array.shape[0] != rows:
            raise TypeError(
                f"leaf {i} of the collated batch has shape {tuple(array.shape)}, but the batch has {rows} samples; "
                "every tensor of a batch must have one row per sample to travel as a Ray Data column"
            )
        columns[str(i)] = np.ascontiguousarray(array)
    # The pickled spec as a uint8 row per sample: Arrow stores that as a tensor column, as it is. An
    # object column costs ~10 ms a batch to convert, and bytes ("S") columns are cut at the first NUL.
    spec_bytes = np.frombuffer(pickle.dumps(spec), dtype=np.uint8)
    columns[SPEC_COLUMN] = np.broadcast_to(spec_bytes, (rows, spec_bytes.size)).copy()
    return columns


def load_batches(rows: dict[str, np.ndarray], *, token: str, dataset: Any, collate_fn: Callable[[list[Any]], Any]) -> dict[str, Any]:
    """The Ray Data UDF: one input row (a batch's indices) in, that batch's columns out."""
    source = dataset_for(token, dataset)
    outputs = []
    for number, seed, indices in zip(rows["batch"], rows["seed"], rows["indices"]):
        seed_batch(int(seed), int(number))
        samples = []
        for index in np.asarray(indices).tolist():
            try:
                samples.append(source[index])
            except Exception as exc:
                raise TaskError.wrap(f"dataset[{index}]", exc) from exc
        try:
            batch = collate_fn(samples)
        except Exception as exc:
            raise TaskError.wrap("collate_fn", exc) from exc
        outputs.append(to_columns(batch, len(samples)))
    if len(outputs) == 1:
        return outputs[0]
    # Ray handed this task several batches at once; ship them as one block (the loader checks sizes).
    return {key: np.concatenate([out[key] for out in outputs]) for key in outputs[0]}
