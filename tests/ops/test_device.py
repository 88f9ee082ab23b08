"""fastpipe's C++ ops have CPU kernels only: every wrapper refuses another device's tensor before dispatch, with
fastpipe's message; and the extensions load whichever module is imported first.

The non-CPU tensor here is a ``meta`` one, which every machine can make: it takes the same path a CUDA tensor
would (the wrappers check ``tensor.device.type``), and without the check it would reach the op's fake kernel
and return silently. ``tests/ops/test_ops.py::test_ops_are_cpu_only_and_say_so`` repeats this with CUDA on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import fastpipe.ops as ops
from fastpipe.errors import ConfigError
from fastpipe.ops import _load

ROOT = Path(__file__).resolve().parents[2]
requires_ext = pytest.mark.skipif(not ops.EXTENSION_AVAILABLE, reason=ops.extension_status())
requires_jpeg = pytest.mark.skipif(not ops.JPEG_OP_AVAILABLE, reason=ops.jpeg_op_status())


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8, device="meta")


def cpu(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8)


MASK_CALLS: dict[str, tuple[Callable[[], Any], str]] = {
    "random_mask_": (lambda: ops.random_mask_(meta(3, 8, 8), 0.25, 1), "img"),
    "apply_mask_ img": (lambda: ops.apply_mask_(meta(3, 8, 8), cpu(8, 8)), "img"),
    "apply_mask_ mask": (lambda: ops.apply_mask_(cpu(3, 8, 8), meta(8, 8)), "mask"),
    "random_mask_out img": (lambda: ops.random_mask_out(meta(3, 8, 8), 0.25, 1, cpu(3, 8, 8)), "img"),
    "random_mask_out out": (lambda: ops.random_mask_out(cpu(3, 8, 8), 0.25, 1, meta(3, 8, 8)), "out"),
}


@requires_ext
@pytest.mark.parametrize("call", list(MASK_CALLS))
def test_mask_ops_refuse_a_non_cpu_tensor_before_dispatch(call: str) -> None:
    """Dispatched, a meta tensor would run the op's fake kernel and return without error: the raise is the wrapper's."""
    run, argument = MASK_CALLS[call]
    with pytest.raises(ConfigError, match=rf"{argument} must be a CPU tensor, got one on meta") as raised:
        run()
    assert "fastpipe's C++ ops run on the CPU" in str(raised.value) and "\n" not in str(raised.value)


@requires_ext
def test_without_the_check_a_meta_tensor_would_pass_silently() -> None:
    """Control for the test above: the op itself accepts the meta tensor (its fake kernel), so only the wrapper refuses it."""
    torch.ops.fastpipe.random_mask_(meta(3, 8, 8), 0.25, 1)


@requires_jpeg
def test_jpeg_ops_refuse_a_non_cpu_tensor_before_dispatch() -> None:
    with pytest.raises(ConfigError, match="source must be a CPU tensor, got one on meta"):
        ops.decode_jpeg_crop(meta(100), (0, 0, 4, 4), (4, 4))
    with pytest.raises(ConfigError, match="data must be a CPU tensor"):
        ops.jpeg.decode_jpeg_crop_op(meta(100), 0, 0, 4, 4, 4, 4)
    with pytest.raises(ConfigError, match=r"data\[1\] must be a CPU tensor"):
        ops.decode_jpeg_crop_batch([cpu(100), meta(100)], [(0, 0, 4, 4)] * 2, (4, 4))
    with pytest.raises(ConfigError, match="boxes must be a CPU tensor"):
        ops.decode_jpeg_crop_batch([cpu(100)], torch.zeros(1, 4, dtype=torch.int64, device="meta"), (4, 4))


def test_cpu_tensors_pass_the_check() -> None:
    from fastpipe.ops._device import require_cpu

    require_cpu("op", img=cpu(3, 4, 4), mask=cpu(4, 4).bool(), seed=None)  # type: ignore[arg-type]  # non-tensors are not checked


IMPORT_PROBE = """
import json, sys
import {first}
import fastpipe.ops as ops
print(json.dumps({{"first": "{first}", "_C": ops.EXTENSION_AVAILABLE, "_jpeg": ops.JPEG_OP_AVAILABLE,
                  "status": ops.extension_status(), "jpeg": ops.jpeg_op_status(),
                  "has_op": hasattr(__import__("torch").ops.fastpipe, "random_mask_")}}))
"""


def _import_first(module: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE.format(first=module)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_load.extension_path("_C") is None, reason="fastpipe._C is not built for this Python")
@pytest.mark.parametrize("first", ["fastpipe.ops", "fastpipe.ops.mask"])
def test_a_fresh_process_importing_the_ops_first_loads_the_extensions(first: str) -> None:
    """The GPU run's skip: ``import fastpipe.ops`` before ``import fastpipe`` (a test module run alone)."""
    got = _import_first(first)
    assert got["_C"] and got["has_op"], got["status"]
    if _load.extension_path("_jpeg") is not None:
        assert got["_jpeg"], got["jpeg"]


def test_the_extension_is_loaded_once_from_its_file() -> None:
    """Loaded by path (a package still running its ``__init__`` is never asked for the attribute), once per process."""
    built = _load.extension_path("_C")
    if built is None:
        pytest.skip("fastpipe._C is not built for this Python")
    assert _load.load_extension("_C") is sys.modules["fastpipe._C"]  # once per process: the registrations ran once
    assert Path(sys.modules["fastpipe._C"].__file__).resolve() == built


def test_a_missing_extension_names_what_was_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "_Z.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")
    with pytest.raises(ImportError, match=r"no _Z\S* in .*found _Z\.cpython-39-x86_64-linux-gnu\.so, built for another Python"):
        _load.load_extension("_Z", tmp_path)
    with pytest.raises(ImportError, match="it was not built"):
        _load.load_extension("_Y", tmp_path)
