"""Which of a script's DataLoaders is its training loader, the one script mode runs the ladder on.

The first loader to deliver a few batches is not it in every script: many validate before they train (a baseline
accuracy, a resumed checkpoint's check), or read a small warm-up loader first. What sets the training loader apart
in an ordinary script is its epoch: it has the most batches. So when a loader has delivered its first
``start_after`` batches of an epoch, it is the training loader unless the script holds (among its live objects) a
DataLoader with a longer epoch (``len(loader)`` batches); then the ladder waits for that one. A loader passed over
this way is taken after all when it begins another epoch and none of the longer ones has delivered a batch meanwhile
(the script trains on it, and the longer one is some loader it only built). A loader without a length (an
``IterableDataset`` without ``__len__``) is not compared: it can be neither longer nor shorter. ``--loader N`` (the
Nth loader the script iterates) overrides all of this.

DataLoaders that existed before the script started (fastpipe's, or a test's in the same process) are not the
script's: :class:`HeldLoaders` is made before it runs and leaves them out.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from dataclasses import dataclass, field

from torch.utils.data import DataLoader


def epoch_length(loader: DataLoader) -> int | None:
    """Batches in one of ``loader``'s epochs, or None when it cannot say (a stream without ``__len__``)."""
    try:
        return len(loader)
    except TypeError:
        return None


def _live_loaders() -> list[DataLoader]:
    with warnings.catch_warnings():  # isinstance on some live objects (deprecated torch aliases) warns
        warnings.simplefilter("ignore")
        return [obj for obj in gc.get_objects() if isinstance(obj, DataLoader)]


@dataclass
class Choice:
    """Whether a loader that reached its first batches is the training loader, and why, in words."""

    chosen: bool
    why: str
    longer: list[DataLoader] = field(default_factory=list)
    """The script's loaders with a longer epoch (the ones it waits for when ``chosen`` is False)."""


class HeldLoaders:
    """The DataLoaders the script holds: live ones, less those alive before it started."""

    def __init__(self) -> None:
        self._before: weakref.WeakSet[DataLoader] = weakref.WeakSet(_live_loaders())

    def script_loaders(self) -> list[DataLoader]:
        return [loader for loader in _live_loaders() if loader not in self._before]

    def choose(self, loader: DataLoader, *, second_epoch: bool, labels: dict[int, str]) -> Choice:
        """Whether ``loader`` is the training loader now; ``second_epoch``: it begins another epoch, having
        been passed over for a longer loader that delivered nothing since. ``labels`` names the loaders iterated so far."""
        length = epoch_length(loader)
        others = [other for other in self.script_loaders() if other is not loader]
        if length is None:
            return Choice(True, "its length is unknown (a stream), so the others' lengths were not compared with it")
        longer = [o for o in others if (n := epoch_length(o)) is not None and n > length]
        if longer and not second_epoch:
            return Choice(False, "", longer)
        named = ", ".join(f"{labels.get(id(o), 'one not iterated yet')}: {epoch_length(o)}" for o in others if epoch_length(o) is not None)
        if longer:
            return Choice(
                True,
                f"{length} batches an epoch; the script began its next epoch while its longer DataLoaders ({named}) delivered "
                "no batch, so this is the one it trains on",
            )
        if not others:
            return Choice(True, f"{length} batches an epoch, the only DataLoader the script holds")
        return Choice(True, f"{length} batches an epoch, the longest epoch of the script's {len(others) + 1} DataLoaders ({named})")
