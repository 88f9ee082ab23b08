"""A sample's fingerprint: what tells two stream items apart without shipping them between processes.

A key the sample carries wins (WebDataset's ``__key__``, with its shard ``__url__`` when present): it survives the
random augmentations that make two copies of one source sample differ in their bytes. Otherwise the bytes of every
tensor, array, buffer and scalar in the item are hashed, in order (dict entries sorted by key).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

KEY_FIELDS = ("__url__", "__key__")
"""The fields of a WebDataset sample (or any dict sample) that name it."""


def sample_key(item: Any) -> str | None:
    """The name an item carries (``__url__/__key__``), or None when it carries none."""
    if isinstance(item, dict) and "__key__" in item:
        return "/".join(str(item[k]) for k in KEY_FIELDS if k in item)
    return None


def _feed(digest: Any, value: Any, depth: int = 0) -> None:
    if depth > 6:
        digest.update(repr(type(value)).encode())
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes() if value.dtype != object else repr(value.tolist()).encode())
    elif isinstance(value, (bytes, bytearray, memoryview)):
        digest.update(bytes(value))
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(str(key).encode())
            _feed(digest, value[key], depth + 1)
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for part in value:
            _feed(digest, part, depth + 1)
        digest.update(b"]")
    elif hasattr(value, "tobytes") and callable(value.tobytes):  # a PIL image
        digest.update(value.tobytes())
    else:
        digest.update(repr(value).encode())


def fingerprint(item: Any) -> tuple[str, str]:
    """(fingerprint, what it was taken from: ``"__key__"`` or ``"bytes"``) of one stream item."""
    key = sample_key(item)
    if key is not None:
        return key, "__key__"
    digest = hashlib.blake2b(digest_size=16)
    _feed(digest, item)
    return digest.hexdigest(), "bytes"
