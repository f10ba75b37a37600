"""Files only their owner may read: confidential outputs and a run's working files (docs/reference/output-layout.md).

Confidential are: the CEF-like input ``topdown ingest`` writes, ``topdown evaluate``'s and ``topdown audit``'s
outputs (computed from the true counts), a run's staging (``.staging/``: chunks not yet published) and
temporary files, and the credentials a batch hands its jobs. They are written into a directory made private
(mode 0700) *before* anything goes in, so there is no moment at which another local user can open them, and
sealed afterwards (files 0600, folders 0700), so they stay private wherever they are moved. A run's
published outputs (histograms, noisy measurements, MDF, invariants, spine, configuration, certificate,
manifest) keep the user's umask: they are the release.

This module imports nothing of the package (any module may use it).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def _local(path: object) -> bool:
    """A local path (an object store's path, ``storage.StorePath``, has no file modes: what protects its objects
    is the bucket's policy and the encryption every write requests; docs/how-to/clusters.md "Object
    storage")."""
    return isinstance(path, (str, os.PathLike))


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and its missing parents) or take it as it is, and make it a private folder (0700)."""
    if not _local(path):
        return path
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def private_file(path: str | Path) -> Path:
    """Create ``path`` empty if absent, and make it private (0600): write into it afterwards."""
    if not _local(path):
        return path
    path = Path(path)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, FILE_MODE)
    os.close(fd)
    os.chmod(path, FILE_MODE)
    return path


def seal(path: str | Path) -> Path:
    """Make ``path`` and everything below it private (files 0600, folders 0700); links are left alone."""
    if not _local(path):
        return path
    path = Path(path)
    for p in (path, *path.rglob("*")) if path.is_dir() else (path,):
        mode = os.lstat(p).st_mode
        if stat.S_ISDIR(mode):
            os.chmod(p, DIR_MODE)
        elif stat.S_ISREG(mode):
            os.chmod(p, FILE_MODE)
    return path


def is_private(path: str | Path) -> bool:
    """True when nobody but the owner may read, write or enter ``path``."""
    if not _local(path):
        return True
    return os.lstat(path).st_mode & 0o077 == 0
