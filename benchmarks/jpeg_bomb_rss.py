"""Decompression bombs against fastpipe's JPEG readers: the error each gives, and the memory it cost.

Two files: a 16x16 baseline JPEG (about 630 bytes) whose frame header is edited to claim
60000x60000, and a valid, highly compressible progressive JPEG of 10000x10000 (about 400 kB,
100 million pixels, over PIL's default limit of 89.5 million). Each goes through
``jpeg_size``, ``decode_jpeg_crop``, ``jpeg_entropy_floor`` and ``DecodeCropOnDevice`` (on the
CPU) in a child process, which reports the error and the growth of its resident memory
during the call: the peak (``VmHWM``, reset through ``/proc/self/clear_refs`` just before the
call) minus the resident size just before it (every op is first run once on a small valid
file and once on a damaged one, so imports and the first error's set-up are not counted). Controls run ``decode_jpeg_crop`` with the
limit disabled (``set_max_image_pixels(None)``), after the guarded calls, to show that the
meter sees what the guard saves. Usage::

    python benchmarks/jpeg_bomb_rss.py            # prints one row per measurement; exits 1 if a guarded call grew > 20 MB

Linux only (it reads /proc).
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GUARDED_LIMIT_MB = 20.0
OPS = ("jpeg_size", "decode_jpeg_crop", "jpeg_entropy_floor", "DecodeCropOnDevice")


def set_frame_size(data: bytes, height: int, width: int) -> bytes:
    """``data`` with its first start-of-frame marker claiming ``height`` x ``width``."""
    sof = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
    pos = 2
    while data[pos] == 0xFF and data[pos + 1] not in sof:
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    out = bytearray(data)
    out[pos + 5 : pos + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(out)


def make_files(folder: Path) -> dict[str, Path]:
    """The two bombs, written under ``folder``; returns {name: path}."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 140, 200)).save(buf, "JPEG")
    header = folder / "claims_60000x60000.jpg"
    header.write_bytes(set_frame_size(buf.getvalue(), 60000, 60000))
    progressive = folder / "progressive_10000x10000.jpg"
    if not progressive.exists():  # 100 MB of grey pixels while encoding; a file (not BytesIO) so PIL can write it whole
        Image.new("L", (10000, 10000), 128).save(progressive, "JPEG", progressive=True, quality=75)
    return {"header": header, "progressive": progressive}


# --------------------------------------------------------------------------------------------
# The child: one or more measured calls in a fresh process.


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> bool:
    """Reset VmHWM to the current resident size (Linux >= 4.0); False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _call(op: str, path: str) -> Any:
    from fastpipe.datasets import DecodeCropOnDevice, EncodedBatch
    from fastpipe.ops import jpeg

    if op == "jpeg_size":
        return jpeg.jpeg_size(path)
    if op == "decode_jpeg_crop":
        height, width = jpeg._jpeg_header_size(Path(path).read_bytes()) or (1, 1)  # the claimed size, unchecked
        return tuple(jpeg.decode_jpeg_crop(path, (0, 0, height, width), (224, 224)).shape)
    if op == "jpeg_entropy_floor":
        return jpeg.jpeg_entropy_floor(path, 10**6)
    if op == "DecodeCropOnDevice":
        return tuple(DecodeCropOnDevice(224, device="cpu").images(EncodedBatch([jpeg.read_bytes(path)]), "cpu").shape)  # type: ignore[arg-type]
    raise ValueError(op)


def measure(op: str, path: str) -> dict[str, Any]:
    """Call ``op`` on ``path`` in this process; the outcome and the resident-memory growth it caused."""
    import gc

    gc.collect()
    exact = _reset_peak()
    before_kb = _status_kb("VmRSS")
    peak_before_kb = max(_status_kb("VmHWM"), 0) if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        result, error = repr(_call(op, path)), None
    except Exception as exc:  # reported, not hidden: the caller decides what is acceptable
        result, error = None, f"{type(exc).__name__}: {exc}"
    peak_kb = _status_kb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "op": op,
        "file": os.path.basename(path),
        "bytes": os.path.getsize(path),
        "result": result,
        "error": error,
        "growth_mb": (peak_kb - before_kb) / 1024,
        # Without clear_refs the peak before the call hides growth up to this much.
        "blind_mb": 0.0 if exact else max(0, peak_before_kb - before_kb) / 1024,
    }


def child(jobs: list[tuple[str, str, str]]) -> None:
    """Measure each (op, path, limit) job in turn; limit "default" or "none" (the limit disabled for that call)."""
    import torch

    from fastpipe.ops import jpeg

    torch.set_num_threads(1)
    # Warm up every op on a small valid file and on a damaged one, so lazy imports and the first
    # error's set-up (torch captures a C++ stack trace) stay out of the measured calls.
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        small, damaged = Path(tmp) / "small.jpg", Path(tmp) / "damaged.jpg"
        Image.new("RGB", (64, 48), (90, 140, 200)).save(small, "JPEG")
        damaged.write_bytes(small.read_bytes()[:-200])
        for op in OPS:
            _call(op, str(small))
            try:
                _call(op, str(damaged))
            except Exception:  # the error is the point of the warm-up
                pass
    for op, path, limit in jobs:
        if limit == "none":
            jpeg.set_max_image_pixels(None)
        row = measure(op, path)
        row["limit"] = "off" if limit == "none" else str(jpeg.max_image_pixels())
        jpeg._max_pixels_setting = jpeg._FOLLOW_PIL  # back to the default for the next job
        print(json.dumps(row), flush=True)


# --------------------------------------------------------------------------------------------
# The parent.


def run_child(jobs: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Run the measured ``jobs`` [(op, path, "default" | "none")] in one fresh child process, in order; returns its rows.

    Put the unguarded jobs last: memory freed by one call can be reused by the next without
    showing as growth, and the guarded calls are the ones that must show none.
    """
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(jobs)], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"the measuring child failed (exit code {out.returncode}): {out.stderr.strip()[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def jobs_for(files: dict[str, Path], controls: tuple[str, ...] = ("header", "progressive")) -> list[tuple[str, str, str]]:
    """Every op on every file at the default limit, then decode_jpeg_crop with the limit off on the ``controls`` files."""
    guarded = [(op, str(path), "default") for path in files.values() for op in OPS]
    return guarded + [("decode_jpeg_crop", str(files[name]), "none") for name in controls]


def run(folder: Path, controls: tuple[str, ...] = ("header", "progressive")) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(guarded rows, control rows), measured in one child process."""
    rows = run_child(jobs_for(make_files(folder), controls))
    return [r for r in rows if r["limit"] != "off"], [r for r in rows if r["limit"] == "off"]


def format_row(row: dict[str, Any]) -> str:
    outcome = row["error"] if row["error"] else f"returned {row['result']}"
    blind = f" (blind to {row['blind_mb']:.0f} MB)" if row["blind_mb"] else ""
    return f"{row['file']:<28} {row['bytes']:>7} B  limit {row['limit']:<9} {row['op']:<19} RSS +{row['growth_mb']:7.1f} MB{blind}  {outcome[:150]}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child([tuple(job) for job in json.loads(sys.argv[2])])
        return 0
    with tempfile.TemporaryDirectory(prefix="fastpipe-bomb-") as tmp:
        guarded, controls = run(Path(tmp))
    for row in guarded + controls:
        print(format_row(row))
    bad = [row for row in guarded if row["growth_mb"] + row["blind_mb"] >= GUARDED_LIMIT_MB or not row["error"]]
    print(
        f"guarded calls: {len(guarded)}, over {GUARDED_LIMIT_MB:.0f} MB or not refused: {len(bad)}; "
        f"largest growth {max(r['growth_mb'] for r in guarded):.1f} MB; unguarded controls grew "
        + ", ".join(f"{r['growth_mb']:.0f} MB" for r in controls)
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
