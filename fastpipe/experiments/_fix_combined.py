"""Combined fixes: the best compatible set of the single fixes that helped, built as one candidate.

After the single fixes are measured (:func:`fastpipe.experiments._fix.measure_fixes`), the ones that helped beyond
noise are joined where they change different things of the user's pipeline:

* at most one **dataset** fix (decode only the crop, uint8 over the copy, or both): the one with the largest measured
  gain; its dataset (and its device Normalize) is what the combined loader reads;
* the **loader settings** (the ``num_workers`` / ``prefetch_factor`` tune chose, or a worker count script mode measured):
  the best such candidate's, applied to the same DataLoader call;
* **recycled batch memory**, wrapping that DataLoader (only with workers: it recycles what workers collate).

A fix that replaces the DataLoader (the ThreadLoader) is not joined with the others: it has no workers to set or
recycle, and is already its own set. A set of one part is the single fix itself, so nothing is built. The combined
candidate goes through the same keep-everything check (:mod:`fastpipe.experiments._fix_keep`) and input check as any
single fix, and is measured against the original and the best single fix in one rotated run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from torch.utils.data import DataLoader

from fastpipe.experiments._fix_candidates import Candidate, refuse_what_drops
from fastpipe.loading._rebuild import rebuild_loader
from fastpipe.workloads._workload import Workload

#: The order parts are named and applied in.
PARTS = ("dataset", "settings", "recycled")


def _pick(helped: Sequence[tuple[Candidate, Any]], kind: str) -> Candidate | None:
    """The candidate of ``kind`` with the largest measured gain among those that helped (None: none of that kind)."""
    of_kind = [(c, r) for c, r in helped if c.kind == kind and c.workload is not None]
    return max(of_kind, key=lambda pair: pair[1].gain or 0.0)[0] if of_kind else None


def combine_fixes(workload: Workload, helped: Sequence[tuple[Candidate, Any]]) -> tuple[Candidate | None, str]:
    """``(the combined candidate, "")`` or ``(None, why none)``; ``helped``: (candidate, its measured result) pairs of the
    single fixes that helped beyond noise, each result with its ``gain``."""
    loader = workload.loader
    if not isinstance(loader, DataLoader):
        return None, f"the loader is a {type(loader).__name__}: only a DataLoader's fixes are combined"
    chosen = {kind: _pick(helped, kind) for kind in PARTS}
    dataset_part, settings_part, recycled_part = (chosen[k] for k in PARTS)
    if recycled_part is not None and settings_part is not None and settings_part.loader.num_workers == 0:
        recycled_part = None  # recycling needs workers; the settings part has none
    parts = [c for c in (dataset_part, settings_part, recycled_part) if c is not None]
    if len(parts) < 2:
        kinds = ", ".join(c.name for c, _ in helped)
        return None, f"the fixes that helped ({kinds}) change one part of the pipeline: there is no set of two to combine"
    base = dataset_part.workload if dataset_part is not None else workload
    assert base is not None
    overrides: dict[str, Any] = {}
    if settings_part is not None:
        tuned = settings_part.loader
        overrides["num_workers"] = tuned.num_workers
        if tuned.num_workers > 0:
            overrides["prefetch_factor"] = tuned.prefetch_factor
    combined_loader = rebuild_loader(loader, base.loader.dataset, **overrides)
    if recycled_part is not None:
        from fastpipe.loading.recycle import recycled

        combined_loader = recycled(combined_loader)
    names = tuple(c.name for c in parts)
    name = "combined: " + " + ".join(names)
    candidate = Candidate(
        name,
        tuple(dict.fromkeys(a for c in parts for a in c.addresses)),
        "; and: ".join(c.code for c in parts),
        workload=dataclasses.replace(
            base, loader=combined_loader, device_transform=base.device_transform, name=f"{workload.name} + {name}", notes=[]
        ),
        compare_pixels=dataset_part.compare_pixels if dataset_part is not None else None,
        boxes=dataset_part.boxes if dataset_part is not None else None,
        direct=dataset_part is None,
        changes_samples=dataset_part.changes_samples if dataset_part is not None else None,
        transform=dataset_part.transform if dataset_part is not None else None,
        original=workload,
        parts=names,
        kind="combined",
    )
    refuse_what_drops(workload, candidate)
    if candidate.not_tried is not None:
        return None, f"the set {' + '.join(names)} cannot keep the loader's settings: {candidate.not_tried}"
    return candidate, ""
