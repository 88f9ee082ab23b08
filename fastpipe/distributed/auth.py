"""Ray's token authentication: recognise a refused connection and say what to set, on which node.

Since Ray 2.52 a cluster can require a shared token from every process that talks to it, and
recent Rays turn it on without being asked, which breaks the plain ``ray start`` recipe. What
Ray 2.60 does (``ray/_private/authentication/authentication_token_setup.py``,
``ray/_private/worker.py``, ``ray/scripts/scripts.py``):

* ``ray.init()`` starting a local cluster enables token auth (sets ``RAY_AUTH_MODE=token`` in
  its process) and writes a token to ``~/.ray/auth_token`` if there is none. fastpipe's own local
  cluster goes through it, so any machine that ran fastpipe on Ray locally has that file.
* ``ray start --head`` with ``RAY_AUTH_MODE`` unset enables token auth whenever a token exists
  (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``).
* ``ray start --address=HEAD:6379`` and ``ray.init(address="HEAD:6379")`` never enable it by
  themselves: without ``RAY_AUTH_MODE=token`` they send no token, even one that is set. The head
  refuses them with ``InvalidAuthToken``; ``ray.init`` retries for about 20 s and then raises a
  bare ``ConnectionError("Failed to connect to Ray cluster at ...")`` whose cause chain holds the
  ``AuthenticationError``. Only ``address="auto"`` picks up a local token by itself.

Once ``RAY_AUTH_MODE=token``, Ray reads the token from ``RAY_AUTH_TOKEN``, else the file named by
``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``; ``ray get-auth-token`` prints it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = "~/.ray/auth_token"
#: What Ray puts in an authentication failure: the GCS's gRPC status, the Python exception's
#: name (it appears in the text of the RuntimeError that wraps it) and the missing-token message.
_FAILURE_MARKERS = ("InvalidAuthToken", "AuthenticationError", "no authentication token was found")


def is_auth_failure(exc: BaseException) -> bool:
    """True when ``exc`` (or anything in its cause/context chain) is Ray refusing a token."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ == "AuthenticationError" for cls in type(current).__mro__):
            return True
        if any(marker in str(current) for marker in _FAILURE_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


def token_auth_on(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process sends a token (Ray also sets the variable when it enables auth itself)."""
    environ = os.environ if environ is None else environ
    return environ.get(AUTH_MODE_VAR, "").strip().lower() == "token"


def token_source(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """Where Ray would read this process's token from, in Ray's order of precedence; None if nowhere."""
    environ = os.environ if environ is None else environ
    if environ.get(TOKEN_VAR, "").strip():
        return TOKEN_VAR
    path = environ.get(TOKEN_PATH_VAR, "")
    if path:
        return f"{TOKEN_PATH_VAR}={path}" if _non_empty(Path(path).expanduser()) else None
    default = (home if home is not None else Path.home()) / ".ray" / "auth_token"
    return DEFAULT_TOKEN_FILE if _non_empty(default) else None


def _non_empty(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def join_command(head: str = "HEAD_IP:6379", environ: Mapping[str, str] | None = None) -> str:
    """The command that adds a data server, with the token variables when this cluster uses a token."""
    if token_auth_on(environ):
        return (
            f"`{AUTH_MODE_VAR}=token {TOKEN_VAR}=<the head's token> ray start --address={head}` (the cluster uses token "
            "authentication: a `ray start` without them fails with InvalidAuthToken; `ray get-auth-token` on the head prints the token)"
        )
    return f"`ray start --address={head}`"


def auth_failure_message(address: str, environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """What went wrong with this process's token, and the variables to set here and on every data server."""
    environ = os.environ if environ is None else environ
    source = token_source(environ, home)
    mode = environ.get(AUTH_MODE_VAR)
    if not token_auth_on(environ):
        state = f"{AUTH_MODE_VAR} is {'not set' if mode is None else repr(mode)}, so this process sends no token"
        if source is not None:
            state += f" (there is one in {source}, but Ray only sends it when {AUTH_MODE_VAR}=token)"
        fix = f"set {AUTH_MODE_VAR}=token" + ("" if source is not None else " and give this process the head's token")
    elif source is None:
        unreadable = environ.get(TOKEN_PATH_VAR, "")
        state = f"{AUTH_MODE_VAR}=token is set but this process has no token " + (
            f"({TOKEN_PATH_VAR}={unreadable} is missing or empty)"
            if unreadable
            else f"({TOKEN_VAR}, {TOKEN_PATH_VAR} and {DEFAULT_TOKEN_FILE} are all empty)"
        )
        fix = "give this process the head's token"
    else:
        state = f"the token this process sends, from {source}, is not the head's"
        fix = "replace it with the head's token"
    head = address if address and "://" not in address and address != "auto" else "HEAD_IP:6379"
    return (
        f"the Ray cluster at address={address!r} uses token authentication and refused this process: {state}. "
        f"To fix it, {fix}: {TOKEN_VAR}=<token>, or {TOKEN_PATH_VAR}=<a file holding it>, or the file {DEFAULT_TOKEN_FILE}; "
        f"`ray get-auth-token` on the head prints it. Every data server needs the same two variables: "
        f"`{AUTH_MODE_VAR}=token {TOKEN_VAR}=<token> ray start --address={head}`"
    )
