"""Reusable buffers, one set per thread (DDP's comm hook runs in its own), for the collectives and the wire
codecs: a fresh multi-MB tensor per message costs page faults that were slower than the bytes saved."""

import threading

import torch

_local = threading.local()


def scratch(name: str, numel: int, dtype, device):
    """The first `numel` elements of this thread's buffer `name` of `dtype` on `device`, grown when too small.
    Its contents are whatever the last user left: the caller overwrites before it reads."""
    cache = _local.__dict__.setdefault("cache", {})
    key = (name, dtype, device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]
