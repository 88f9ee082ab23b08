"""A piece of work with a deadline, for probes that read the user's pipeline in the main process: a pipeline that
hangs must not hang the diagnosis."""

from __future__ import annotations

from typing import Any, Callable


def within(timeout: float | None, work: Callable[[], Any], what: str) -> Any:
    """``work()``, or TimeoutError after ``timeout`` seconds (None: wait as long as it takes)."""
    if timeout is None:
        return work()
    import threading

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # handed to the caller's thread below
            result["error"] = exc

    thread = threading.Thread(target=run, name="fastpipe-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{what} took over {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]
