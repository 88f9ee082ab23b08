"""Joining a Ray cluster that uses token authentication (Ray >= 2.52; turned on by itself in recent Rays).

The first tests fake what Ray raises (the exact shapes Ray 2.60 raises, captured from a real
refused connection) and need no Ray. The last one builds a real two-node cluster on this machine:
the head on the host, a data server in its own network namespace on a private test address,
joined with the token the way the README says, and checks that the data tasks of a RayLoader
ran on both nodes. It needs root, ``ip`` (iproute2), network namespaces and Ray, and is skipped,
with the reason, where any is missing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from fastpipe.distributed import RayLoader, auth
from fastpipe.distributed import cluster as ray_cluster
from fastpipe.errors import ConfigError

ADDRESS = "10.9.8.7:6379"
TOKEN = "0123456789abcdef0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


class AuthenticationError(Exception):
    """Stands for ray.exceptions.AuthenticationError where Ray is not installed (matched by name, as Ray's is)."""


def refused_connection(auth_error: type[BaseException] = AuthenticationError) -> ConnectionError:
    """What ``ray.init(address=...)`` raises when the head refuses the token (Ray 2.60): the cause holds the reason."""
    grpc = auth_error("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
    wrapped = RuntimeError(
        "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
        '  File "python/ray/includes/common.pxi", line 119, in ray._raylet.check_status\n'
        f"ray.exceptions.AuthenticationError: {grpc}"
    )
    wrapped.__cause__ = grpc
    error = ConnectionError(f"Failed to connect to Ray cluster at {ADDRESS}")
    error.__cause__ = wrapped
    return error


def fake_ray(raises: BaseException) -> SimpleNamespace:
    def init(**kwargs: Any) -> None:
        raise raises

    return SimpleNamespace(is_initialized=lambda: False, init=init)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Ray auth variables, and an empty home (so no ~/.ray/auth_token); returns the home."""
    for name in (auth.AUTH_MODE_VAR, auth.TOKEN_VAR, auth.TOKEN_PATH_VAR, "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def connect_error(monkeypatch: pytest.MonkeyPatch, raises: BaseException) -> ConfigError:
    """The error a RayLoader given ``address`` raises when Ray's ``init`` raises ``raises``."""
    monkeypatch.setattr(ray_cluster, "require_ray", lambda: fake_ray(raises))
    loader = RayLoader(list(range(8)), batch_size=4, address=ADDRESS)
    with pytest.raises(ConfigError) as caught:
        loader.num_workers  # connects: the cluster's CPUs are the default
    assert caught.value.__cause__ is raises
    return caught.value


# ----- the error for a refused token (no Ray needed) ----------------------------------------
def test_no_auth_mode_says_to_set_it_and_where_the_token_is(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    message = str(connect_error(monkeypatch, refused_connection()))
    assert f"address={ADDRESS!r} uses token authentication" in message
    assert "RAY_AUTH_MODE is not set, so this process sends no token" in message
    assert "set RAY_AUTH_MODE=token and give this process the head's token" in message
    assert "`ray get-auth-token` on the head prints it" in message
    assert f"`RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<token> ray start --address={ADDRESS}`" in message
    assert "start one with `ray start --head`" not in message, "the cluster is there; starting another is not the fix"


def test_a_token_without_the_mode_is_named(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    (clean_env / ".ray").mkdir()
    (clean_env / ".ray" / "auth_token").write_text(TOKEN)
    message = str(connect_error(monkeypatch, refused_connection()))
    assert "there is one in ~/.ray/auth_token, but Ray only sends it when RAY_AUTH_MODE=token" in message
    assert "To fix it, set RAY_AUTH_MODE=token:" in message

    monkeypatch.setenv(auth.TOKEN_VAR, TOKEN)
    monkeypatch.setenv(auth.AUTH_MODE_VAR, "disabled")
    message = str(connect_error(monkeypatch, refused_connection()))
    assert "RAY_AUTH_MODE is 'disabled'" in message and "there is one in RAY_AUTH_TOKEN" in message


def test_a_wrong_token_is_told_apart_from_a_missing_one(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    monkeypatch.setenv(auth.AUTH_MODE_VAR, "token")
    monkeypatch.setenv(auth.TOKEN_VAR, "not-the-heads-token")
    message = str(connect_error(monkeypatch, refused_connection()))
    assert "the token this process sends, from RAY_AUTH_TOKEN, is not the head's" in message
    assert "replace it with the head's token" in message

    # Ray's own check, before any connection: token mode on and no token anywhere.
    monkeypatch.delenv(auth.TOKEN_VAR)
    missing = AuthenticationError("Token authentication is enabled but no authentication token was found")
    message = str(connect_error(monkeypatch, missing))
    assert "RAY_AUTH_MODE=token is set but this process has no token" in message

    monkeypatch.setenv(auth.TOKEN_PATH_VAR, str(clean_env / "absent"))
    message = str(connect_error(monkeypatch, missing))
    assert f"RAY_AUTH_TOKEN_PATH={clean_env / 'absent'} is missing or empty" in message


def test_other_connection_failures_keep_their_own_message(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    message = str(connect_error(monkeypatch, ConnectionError(f"Failed to connect to Ray cluster at {ADDRESS}")))
    assert "cannot connect to the Ray cluster" in message and "start one with `ray start --head`" in message
    assert "token" not in message

    class Unrelated(Exception):
        pass

    monkeypatch.setattr(ray_cluster, "require_ray", lambda: fake_ray(Unrelated("a bug elsewhere")))
    with pytest.raises(Unrelated):  # not dressed up as a configuration problem
        RayLoader(list(range(8)), batch_size=4, address=ADDRESS).num_workers


def test_rays_own_authentication_error_is_recognised(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    exceptions = pytest.importorskip("ray.exceptions")
    assert auth.is_auth_failure(refused_connection(exceptions.AuthenticationError))
    assert auth.is_auth_failure(exceptions.AuthenticationError("no authentication token was found"))
    assert not auth.is_auth_failure(ConnectionError(f"Failed to connect to Ray cluster at {ADDRESS}"))


def test_adding_nodes_names_the_token_when_the_cluster_uses_one(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    alive = [{"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 2.0}}]
    with pytest.raises(ConfigError) as plain:
        ray_cluster._choose_nodes(alive, 2, "a" * 56)
    assert "`ray start --address=HEAD_IP:6379`" in str(plain.value) and "TOKEN" not in str(plain.value)
    monkeypatch.setenv(auth.AUTH_MODE_VAR, "token")  # Ray sets it in the process when it turns auth on
    with pytest.raises(ConfigError, match=r"RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<the head's token> ray start --address"):
        ray_cluster._choose_nodes(alive, 2, "a" * 56)


# ----- a real two-node cluster: the head here, a data server in a network namespace ----------
def _why_no_two_node_cluster() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "making a network namespace needs root"
    if shutil.which("ip") is None:
        return "needs `ip` from iproute2 (apt-get install iproute2)"
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'fastpipe[ray]')"
    if not (Path(sys.executable).parent / "ray").exists():
        return f"no `ray` command next to {sys.executable}"
    return None


class TwoNodes:
    """Host and namespace ends of a veth pair, and the processes this test started (all cleaned up)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tag = uuid.uuid4().hex[:8]
        self.netns = f"fpray{self.tag}"
        self.host_if, self.ns_if = f"fp{self.tag}h", f"fp{self.tag}n"
        self.marker = f"fastpipe-ray-test-{self.tag}"  # in every process's environment, to find strays by
        self.head_ip = self.server_ip = ""
        self.processes: list[subprocess.Popen[bytes]] = []

    def ip(self, *args: str, netns: bool = False) -> subprocess.CompletedProcess[str]:
        command = ["ip", "netns", "exec", self.netns, "ip", *args] if netns else ["ip", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    def make_network(self) -> None:
        added = self.ip("netns", "add", self.netns)
        if added.returncode != 0:
            pytest.skip(f"cannot make a network namespace here: {added.stderr.strip()}")
        used = self.ip("-4", "-o", "addr").stdout
        third = next(n for n in range(200, 255) if f"10.{n}.0." not in used)  # a /24 nobody uses here
        net = ipaddress.ip_network(f"10.{third}.0.0/24")
        self.head_ip, self.server_ip = str(net[1]), str(net[2])
        for args, in_ns in [
            (("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if), False),
            (("link", "set", self.ns_if, "netns", self.netns), False),
            (("addr", "add", f"{self.head_ip}/24", "dev", self.host_if), False),
            (("link", "set", self.host_if, "up"), False),
            (("addr", "add", f"{self.server_ip}/24", "dev", self.ns_if), True),
            (("link", "set", self.ns_if, "up"), True),
            (("link", "set", "lo", "up"), True),
        ]:
            done = self.ip(*args, netns=in_ns)
            assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
        env.update(HOME=str(home), FASTPIPE_TEST_CLUSTER=self.marker, PYTHONPATH=str(REPO), **extra)
        return env

    def ray(
        self, *args: str, env: dict[str, str], in_netns: bool = False, block: bool = True, log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        command = [str(Path(sys.executable).parent / "ray"), *args, *(["--block"] if block else [])]
        if in_netns:
            command = ["ip", "netns", "exec", self.netns, *command]
        out = open(log, "wb") if log is not None else subprocess.DEVNULL
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def cleanup(self) -> None:
        for process in self.processes:  # each `ray start` leads a process group holding its Ray processes
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5  # Ray's processes stop in a second or two; then SIGKILL
        while time.monotonic() < deadline and any(_group_alive(p.pid) for p in self.processes):
            time.sleep(0.2)
        for process in self.processes:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                process.wait(timeout=5)
        for pid in _pids_with_marker(self.marker):  # anything that left the group still carries the marker
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                os.kill(pid, signal.SIGKILL)
        if self.netns:
            for pid in self.ip("netns", "pids", self.netns).stdout.split():
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    os.kill(int(pid), signal.SIGKILL)
            self.ip("netns", "del", self.netns)  # takes the veth pair with it
        self.ip("link", "del", self.host_if)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _pids_with_marker(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"FASTPIPE_TEST_CLUSTER={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.25)
    pytest.fail(f"`{' '.join(map(str, process.args))}` did not print {text!r}:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    reason = _why_no_two_node_cluster()
    if reason is not None:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="fpray-", dir="/tmp"))  # short: Ray's socket paths live under it
    nodes = TwoNodes(root)
    try:
        nodes.make_network()
        yield nodes
    finally:
        nodes.cleanup()
        shutil.rmtree(root, ignore_errors=True)


DRIVER = textwrap.dedent('''
    import json, sys, time
    import torch
    from torch.utils.data import Dataset
    from fastpipe.distributed import RayLoader
    from fastpipe.errors import ConfigError

    class WhereAmI(Dataset):
        """Each sample says which Ray node made it (its node ID, as uint8 bytes) and its index."""
        def __len__(self):
            return 32
        def __getitem__(self, index):
            import ray
            time.sleep(0.05)  # long enough for the two nodes' tasks to overlap
            node = ray.get_runtime_context().get_node_id().encode()
            return torch.tensor(list(node), dtype=torch.uint8), index

    address, expect_nodes = sys.argv[1], int(sys.argv[2])
    try:
        RayLoader(WhereAmI(), batch_size=4, address=address).num_workers  # connects, as a first epoch would
    except ConfigError as exc:
        print(json.dumps({"config_error": str(exc)}))
        sys.exit(0)
    import ray
    deadline = time.monotonic() + 90
    while len([n for n in ray.nodes() if n["Alive"]]) < expect_nodes and time.monotonic() < deadline:
        time.sleep(0.5)
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    loader = RayLoader(WhereAmI(), batch_size=4, address=address, nodes=expect_nodes)
    seen, indices = {}, []
    for ids, idx in loader:
        for row in ids:
            node = bytes(row.tolist()).decode()
            seen[node] = seen.get(node, 0) + 1
        indices += idx.tolist()
    print(json.dumps({"nodes": nodes, "seen": seen, "indices": indices}))
''')


def run_driver(nodes: TwoNodes, env: dict[str, str], address: str, expect_nodes: int) -> dict[str, Any]:
    script = nodes.root / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, str(script), address, str(expect_nodes)],
        env=env,
        cwd=nodes.root,
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"driver failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_ray_nodes_joined_with_the_token_run_the_data_tasks(two_nodes: TwoNodes) -> None:
    nodes = two_nodes
    head_home, server_home = nodes.root / "head-home", nodes.root / "server-home"
    head_home.mkdir()
    server_home.mkdir()  # another machine: no ~/.ray/auth_token there
    port = free_port(nodes.head_ip)
    address = f"{nodes.head_ip}:{port}"
    ray_cmd = str(Path(sys.executable).parent / "ray")

    # The recipe, on the head: make the token, start the head with token auth on, print the token.
    subprocess.run([ray_cmd, "get-auth-token", "--generate"], env=nodes.env(head_home), check=True, capture_output=True, timeout=60)
    token = subprocess.run(
        [ray_cmd, "get-auth-token"], env=nodes.env(head_home), check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert token and (head_home / ".ray" / "auth_token").read_text().strip() == token
    head_log = nodes.root / "head.log"
    head = nodes.ray(
        "start",
        "--head",
        f"--node-ip-address={nodes.head_ip}",
        f"--port={port}",
        "--num-cpus=1",
        "--object-store-memory=100000000",
        "--include-dashboard=false",
        f"--dashboard-port={free_port(nodes.head_ip)}",
        f"--ray-client-server-port={free_port(nodes.head_ip)}",
        f"--dashboard-agent-listen-port={free_port(nodes.head_ip)}",
        f"--temp-dir={nodes.root / 'head'}",
        "--disable-usage-stats",
        env=nodes.env(head_home, RAY_AUTH_MODE="token"),
        log=head_log,
    )
    wait_for_line(head_log, "Ray runtime started", head, timeout=90)
    server_args = (
        "start",
        f"--address={address}",
        "--num-cpus=1",
        "--object-store-memory=100000000",
        f"--temp-dir={nodes.root / 'server'}",
        "--disable-usage-stats",
    )
    quick = {"RAY_gcs_server_port_wait_time_s": "3"}  # Ray retries a refused connection for ~20 s otherwise

    # The trap: a data server joining as the old README said is refused.
    old_log = nodes.root / "server-without-token.log"
    old = nodes.ray(*server_args, env=nodes.env(server_home, **quick), in_netns=True, block=False, log=old_log)
    assert old.wait(timeout=120) != 0
    assert "InvalidAuthToken" in old_log.read_text(errors="replace")

    # fastpipe told to use the cluster without RAY_AUTH_MODE: its error says what to set.
    refused = run_driver(nodes, nodes.env(head_home, **quick), address, expect_nodes=0)
    message = refused.get("config_error", "")
    assert "uses token authentication and refused this process" in message, refused
    assert "RAY_AUTH_MODE is not set" in message and "there is one in ~/.ray/auth_token" in message

    # The fix: the data server gets RAY_AUTH_MODE=token and the head's token, the trainer RAY_AUTH_MODE=token
    # (on the head, Ray reads the token from ~/.ray/auth_token).
    server_log = nodes.root / "server.log"
    server = nodes.ray(*server_args, env=nodes.env(server_home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token), in_netns=True, log=server_log)
    wait_for_line(server_log, "Ray runtime started", server, timeout=90)
    result = run_driver(nodes, nodes.env(head_home, RAY_AUTH_MODE="token"), address, expect_nodes=2)

    assert sorted(result["nodes"].values()) == sorted([nodes.head_ip, nodes.server_ip])
    assert set(result["seen"]) == set(result["nodes"]), f"tasks ran on {result['seen']} of {result['nodes']}"
    assert sorted(result["indices"]) == list(range(32)) and sum(result["seen"].values()) == 32
