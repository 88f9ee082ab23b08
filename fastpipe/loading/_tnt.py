"""torchtnt's CudaDataPrefetcher behind fastpipe's prefetcher interface, to compare the two side by side.

The wrapper keeps torchtnt's behaviour as it ships (a new stream per epoch, no ``record_stream``,
no pinning of its own), because the point is to measure that behaviour. It adds only what the
interface needs: ``len()``, ``close()`` that stops the loader's workers, and the device transform,
which torchtnt has no hook for, so it runs after hand-over on the consumer's stream, as a
torchtnt user would write it.

Importing torchtnt 0.2.4 imports ``pkg_resources``, which setuptools 81 removed and older
setuptools warns about. :func:`import_cuda_data_prefetcher` silences that warning and turns the
import failures into errors that say what to install. A ``pkg_resources`` shim was considered and
rejected: it would be process-global, and other libraries test for ``pkg_resources`` to choose
code paths, so a fake one could change their behaviour behind the user's back.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Iterable, Iterator

from fastpipe.devices import Device, parse_device
from fastpipe.errors import ConfigError, OptionalDependencyError
from fastpipe.loading._pinning import shutdown_iterator
from fastpipe.loading._prefetch_args import DeviceLike, Transform, check_prefetch_args

TESTED_TORCHTNT = "0.2.4"


def import_cuda_data_prefetcher() -> type:
    """``torchtnt.utils.data.CudaDataPrefetcher``, or an :class:`OptionalDependencyError` that says how to get it."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
            from torchtnt.utils.data import CudaDataPrefetcher
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing == "torchtnt":
            raise OptionalDependencyError("prefetcher='tnt' needs torchtnt, which is not installed: pip install 'fastpipe[tnt]'") from exc
        if missing == "pkg_resources":
            raise OptionalDependencyError(
                "torchtnt is installed but cannot be imported: it imports pkg_resources, which setuptools 81 removed; "
                "fix it with pip install \"setuptools<81\" (pip install 'fastpipe[tnt]' pins it)"
            ) from exc
        raise OptionalDependencyError(
            f"torchtnt is installed but cannot be imported: it needs the module '{exc.name}', which is missing; "
            f"install the package that provides it (fastpipe is tested with torchtnt {TESTED_TORCHTNT})"
        ) from exc
    except ImportError as exc:
        raise OptionalDependencyError(
            f"torchtnt is installed but failed to import ({exc}); fastpipe is tested with torchtnt {TESTED_TORCHTNT}"
        ) from exc
    return CudaDataPrefetcher


class TntPrefetcher:
    """torchtnt's ``CudaDataPrefetcher`` over ``loader``, re-iterable per epoch, with ``len()``.

    Raises:
        ConfigError: ``device`` is not CUDA (torchtnt's prefetcher is CUDA-only).
        OptionalDependencyError: torchtnt is missing or cannot be imported.
    """

    def __init__(self, loader: Iterable[Any], device: DeviceLike, depth: int = 2, transform: Transform | None = None) -> None:
        check_prefetch_args(depth, transform)
        self.device: Device = parse_device(device)
        if self.device.kind != "cuda":
            raise ConfigError(
                f"prefetcher='tnt' is torchtnt's CudaDataPrefetcher, which is CUDA-only, and the device is "
                f"'{self.device.spec}'; use prefetcher='fastpipe', which works on cuda, cpu and sim"
            )
        self.loader = loader
        self.depth = depth
        self.transform = transform
        self._prefetcher_class = import_cuda_data_prefetcher()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> "TntIterator":
        return TntIterator(self)


class TntIterator(Iterator[Any]):
    """One epoch of torchtnt's prefetcher; ``close()`` shuts the loader's workers down now."""

    def __init__(self, owner: TntPrefetcher) -> None:
        self._source = iter(owner.loader)
        # A loader iterator returns itself from iter(), so torchtnt's constructor and its own
        # __iter__ reuse this one instead of each starting another set of workers.
        self._prefetcher = owner._prefetcher_class(self._source, owner.device.torch_device, num_prefetch_batches=owner.depth)
        self._transform = owner.transform
        self._shutdown = weakref.finalize(self, shutdown_iterator, self._source)

    def __next__(self) -> Any:
        if not self._shutdown.alive:
            raise StopIteration
        batch = next(self._prefetcher)
        return batch if self._transform is None else self._transform(batch)

    def __iter__(self) -> "TntIterator":
        return self

    def close(self) -> None:
        """Stop the loader's workers now rather than when the iterator is collected."""
        self._shutdown()
