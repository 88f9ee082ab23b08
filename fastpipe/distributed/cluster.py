"""Which Ray cluster the data tasks run on, and who is responsible for stopping it.

Three cases, decided the first time a Ray loader needs a cluster:

* Ray is already initialised in this process (the user called ``ray.init``, or Ray Train did):
  that connection is used and never shut down by fastpipe.
* ``address`` is given (``"auto"``, ``"host:6379"``, ``"ray://host:10001"``), or Ray's own
  ``RAY_ADDRESS`` environment variable is set: fastpipe connects to that existing cluster. It
  did not start the cluster, so it never stops it.
  If the cluster uses Ray's token authentication and this process lacks the token, the error
  says which variables to set (see :mod:`fastpipe.distributed.auth`).
* Neither: fastpipe starts a local single-node cluster and owns it. It shuts it down when a
  loader is closed, when the pipeline fails, and on Ctrl-C, so no Ray processes are left behind.

Ctrl-C needs care: the KeyboardInterrupt usually lands in the training loop's own body, not in
fastpipe's code. While fastpipe owns a cluster it therefore chains a small SIGINT handler that
only records the interrupt and then behaves exactly like the previous handler; the loader's
iterator, which Python closes while the exception unwinds the loop, sees the mark and shuts the
cluster down. Nothing Ray-related runs inside the signal handler itself, where Ray's own locks
could be held by the interrupted code.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from fastpipe._system import usable_cores
from fastpipe.distributed import auth
from fastpipe.distributed._ray import require_ray
from fastpipe.errors import ConfigError

#: Object store size for a cluster fastpipe starts itself: room for a few dozen full-size toy
#: batches (50 MB each) without taking a third of the machine's memory, Ray's default.
DEFAULT_LOCAL_OBJECT_STORE_BYTES = 1 << 30
NODE_ID_LABEL = "ray.io/node-id"


@dataclass
class _State:
    owned: bool = False
    generation: int = 0
    """Bumped whenever a cluster fastpipe owns stops, so objects put into it are known to be gone."""
    interrupted: bool = False
    previous_sigint: Any = None
    hooked: bool = False


_state = _State()
_lock = threading.RLock()


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster a loader's epoch runs on."""

    owned: bool
    generation: int
    cpus: float
    """CPUs on the nodes the data tasks may use."""
    node_ids: tuple[str, ...] | None
    """The nodes the tasks are restricted to, or None for any node."""


def ensure_cluster(address: str | None, num_cpus: float | None, object_store_memory: int | None) -> bool:
    """Connect to (or start) a cluster if this process has none; True when fastpipe started it."""
    ray = require_ray()
    address = address or os.environ.get("RAY_ADDRESS") or None  # Ray's own variable for "use this cluster"
    with _lock:
        if ray.is_initialized():
            return _state.owned
        if address is None:
            cpus = usable_cores() if num_cpus is None else max(1, int(round(num_cpus)))
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                object_store_memory=object_store_memory or DEFAULT_LOCAL_OBJECT_STORE_BYTES,
                logging_level=logging.WARNING,
            )
            _state.owned = True
            _state.interrupted = False
            _hook_sigint()
            return True
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except Exception as exc:
            # Ray reports a refused token as a bare ConnectionError (the AuthenticationError is in its
            # cause chain), or raises AuthenticationError itself, which is neither of the types below.
            if auth.is_auth_failure(exc):
                raise ConfigError(auth.auth_failure_message(address)) from exc
            if not isinstance(exc, (ConnectionError, RuntimeError, ValueError)):
                raise
            raise ConfigError(
                f"cannot connect to the Ray cluster at address={address!r} ({type(exc).__name__}: {exc}); start one with "
                f"`ray start --head` (then {auth.join_command()} on each data server), or pass address=None "
                "to have fastpipe start a local cluster"
            ) from exc
        _state.owned = False
        return False


def owns_cluster() -> bool:
    """True while the running Ray cluster is one fastpipe started."""
    return _state.owned and _ray_initialized()


def generation() -> int:
    return _state.generation


def shutdown_owned() -> bool:
    """Stop the cluster if fastpipe started it; returns whether it did. Connections fastpipe did not start are left alone."""
    with _lock:
        if not _state.owned:
            return False
        _state.owned = False
        _state.interrupted = False
        _state.generation += 1
        _unhook_sigint()
        if _ray_initialized():
            import ray

            ray.shutdown()
        return True


def shutdown_if_interrupted() -> bool:
    """Stop an owned cluster if Ctrl-C was pressed since it started; called when an epoch's iterator closes."""
    if _state.interrupted:
        return shutdown_owned()
    return False


def _ray_initialized() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def _on_sigint(signum: int, frame: Any) -> Any:
    _state.interrupted = True
    previous = _state.previous_sigint
    if callable(previous):
        return previous(signum, frame)
    if previous == signal.SIG_IGN:
        return None
    raise KeyboardInterrupt


def _hook_sigint() -> None:
    if _state.hooked or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; close() still shuts down
    _state.previous_sigint = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _on_sigint)
    _state.hooked = True


def _unhook_sigint() -> None:
    if not _state.hooked or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is _on_sigint:  # someone else's handler set since then stays
        signal.signal(signal.SIGINT, _state.previous_sigint if _state.previous_sigint is not None else signal.default_int_handler)
    _state.hooked = False
    _state.previous_sigint = None


def cluster_info(nodes: int | Sequence[str] | None) -> ClusterInfo:
    """The CPUs and nodes the data tasks may use, after :func:`ensure_cluster`.

    ``nodes`` restricts the tasks: an int N picks the driver's node and the N-1 other nodes with
    the most CPUs; a list names nodes by Ray node ID or IP address.
    """
    ray = require_ray()
    alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    if not alive:
        raise ConfigError(f"the Ray cluster has no live node with CPUs; add data servers with {auth.join_command()}")
    if nodes is None:
        return ClusterInfo(_state.owned, _state.generation, float(sum(n["Resources"]["CPU"] for n in alive)), None)
    chosen = _choose_nodes(alive, nodes, ray.get_runtime_context().get_node_id())
    cpus = float(sum(n["Resources"]["CPU"] for n in chosen))
    return ClusterInfo(_state.owned, _state.generation, cpus, tuple(n["NodeID"] for n in chosen))


def _choose_nodes(alive: list[dict[str, Any]], nodes: int | Sequence[str], driver_node: str) -> list[dict[str, Any]]:
    if isinstance(nodes, bool) or (not isinstance(nodes, int) and isinstance(nodes, (str, bytes))):
        raise ConfigError(f"nodes must be a number of nodes or a list of node IDs / IP addresses, got {nodes!r}")
    if isinstance(nodes, int):
        if nodes < 1:
            raise ConfigError(f"nodes must be at least 1, got {nodes}")
        if nodes > len(alive):
            raise ConfigError(
                f"nodes={nodes} asked for, but the Ray cluster has {len(alive)} live node(s) with CPUs; add data servers "
                f"with {auth.join_command()} on more machines, or ask for fewer nodes"
            )
        ordered = sorted(alive, key=lambda n: (n["NodeID"] != driver_node, -n["Resources"]["CPU"]))
        return ordered[:nodes]
    wanted = list(nodes)
    chosen = []
    for name in wanted:
        match = next((n for n in alive if name in (n["NodeID"], n.get("NodeManagerAddress"))), None)
        if match is None:
            known = ", ".join(f"{n['NodeID'][:12]}… ({n.get('NodeManagerAddress')})" for n in alive)
            raise ConfigError(f"no live Ray node with CPUs has ID or IP {name!r}; the nodes are: {known}")
        if match not in chosen:
            chosen.append(match)
    return chosen


def node_label_selector(node_ids: tuple[str, ...] | None) -> dict[str, str] | None:
    """A Ray label selector that keeps tasks on ``node_ids`` (Ray labels every node with its ID)."""
    if node_ids is None:
        return None
    return {NODE_ID_LABEL: f"in({','.join(node_ids)})"}
