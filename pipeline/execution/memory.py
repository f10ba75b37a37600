"""Giving the driver's freed memory back to the operating system between stages.

The driver's stages (reading the shards' summaries, building a level's invariants and constraints) make
large short-lived arrays; glibc's allocator keeps much of what they free in its heap, so the process's
resident size would be set by the largest transient of any stage rather than by what it holds. After a
stage the driver collects young garbage, returns the Arrow memory pool's unused pages and asks glibc to trim
its heap (``malloc_trim``; elsewhere a no-op).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import lru_cache

import pyarrow as pa


#: glibc's ``mallopt`` parameter for the most heaps (arenas) its threads may use.
M_ARENA_MAX = -8
#: Heaps for the driver: the client, the embedded scheduler and their communication threads would
#: otherwise each free into a heap of their own, which ``malloc_trim`` cannot empty while any is in use.
DRIVER_ARENAS = 2


@lru_cache(maxsize=1)
def _libc():
    """glibc, or None on a C library without ``malloc_trim`` and ``mallopt``."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def limit_heaps() -> None:
    """Cap the driver's glibc heaps at :data:`DRIVER_ARENAS` (call before the cluster's threads start) and let
    Arrow allocate from them, so that :func:`release_memory` returns what Arrow freed too (mimalloc, Arrow's
    default pool, kept about 20 MB more of a 500 k-block state's driver)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, DRIVER_ARENAS)
        pa.set_memory_pool(pa.system_memory_pool())


def release_memory() -> None:
    """Collect young garbage and return the freed heap to the operating system where the C library can
    (about a millisecond: it runs after every stage, also of small runs)."""
    gc.collect(1)  # the young generations, where a stage's garbage is; a full collection costs 0.1 s or more
    pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
