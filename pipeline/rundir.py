"""The run directory: layout, one-writer lock, atomic level writes, and the manifest.

Layout (DESIGN.md section 2)::

    manifest.json  certificate.json  config.json  spine.parquet
    invariants/<product>.parquet            declared-public invariants per node (level, geocode, ...)
    noisy_measurements/<product>/level=<L>/ geocode, query, answer, value, variance
    histograms/<product>/level=<L>/         geocode, cell, count
    mdf/<product>/                          one row per person / unit, tabulation geography

Every directory is written under ``.staging/`` and renamed into place when complete, so a reader
never sees half a level.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("topdown")

STAGING = ".staging"
LOCK = ".lock"
#: Everything a run writes into its directory (a fresh run removes these, and nothing else, first).
OUTPUTS = ("manifest.json", "certificate.json", "config.json", "spine.parquet", "invariants", "noisy_measurements",
           "histograms", "mdf", "evaluation", "evaluation-CONFIDENTIAL", STAGING)


class RunDirError(RuntimeError):
    """The run directory cannot be used (locked, not writable, or inconsistent)."""


class RunDir:
    """Paths and atomic writes inside one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def config_path(self) -> Path:
        """The resolved configuration the run used (JSON; ``Config.digest`` of it is the manifest's config hash)."""
        return self.root / "config.json"

    def histograms(self, product: str, level: str) -> Path:
        return self.root / "histograms" / product / f"level={level}"

    def measurements(self, product: str, level: str) -> Path:
        return self.root / "noisy_measurements" / product / f"level={level}"

    def mdf(self, product: str) -> Path:
        return self.root / "mdf" / product

    def invariants(self, product: str) -> Path:
        return self.root / "invariants" / f"{product}.parquet"

    def chunk_records(self, product: str, level: str) -> Path:
        """Where a level's finished chunks are recorded while it runs (for --resume inside a level)."""
        return self.root / STAGING / "chunks" / product / f"level={level}"

    def staging(self, final: Path) -> Path:
        """The staging twin of a final path (same relative path under ``.staging``)."""
        return self.root / STAGING / final.relative_to(self.root)

    # -- lifecycle -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the directory or check it is writable (nothing else is touched before the lock)."""
        writable_dir(self.root, "the run directory")

    def clear_staging(self) -> None:
        """Remove half-written output of an interrupted run (call only while holding the lock)."""
        shutil.rmtree(self.root / STAGING, ignore_errors=True)

    def clear_outputs(self) -> None:
        """Remove every output of an earlier run (call only while holding the lock): nothing of another
        configuration or product survives a fresh run."""
        for name in OUTPUTS:
            path = self.root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    def measured_levels(self) -> dict[str, list[str]]:
        """Per product, the levels whose noisy measurements are in place (released)."""
        base = self.root / "noisy_measurements"
        found = {p.name: sorted(d.name.removeprefix("level=") for d in p.glob("level=*"))
                 for p in sorted(base.iterdir()) if p.is_dir()} if base.is_dir() else {}
        return {product: levels for product, levels in found.items() if levels}

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the one-writer lock of this run directory.

        The lock file records ``pid <pid> on <host> since <time>``. A lock left by a process of this host
        that no longer exists (a killed run) is stale and taken over, with a warning in the log; a lock
        of another host, or of a live process, refuses the run with a message naming the holder.
        """
        path = self.root / LOCK
        fd = self._try_create(path)
        if fd is None:
            holder = _read_lock(path)
            if holder is not None and _is_stale(holder):
                self._take_over(path, holder)
                fd = self._try_create(path)
            if fd is None:
                holder = _read_lock(path) or "holder unknown"
                raise RunDirError(
                    f"{self.root} is locked by another run ({holder}). If no run is active, delete {path}."
                )
        with os.fdopen(fd, "w") as fh:
            fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    @staticmethod
    def _try_create(path: Path) -> int | None:
        try:
            return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return None

    def _take_over(self, path: Path, holder: str) -> None:
        """Move a stale lock aside (atomic rename) and delete it if it is still the one judged stale."""
        aside = path.with_name(f"{LOCK}.stale-{os.getpid()}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return  # another process took it over first; the O_EXCL create decides
        if _read_lock(aside) != holder:  # a fresh lock replaced the stale one meanwhile: put it back
            os.rename(aside, path)
            return
        aside.unlink(missing_ok=True)
        log.warning("%s: took over the stale lock of a run that no longer exists (%s)", self.root, holder)

    def commit(self, final: Path) -> None:
        """Move a staged file or directory into place, replacing any earlier version."""
        staged = self.staging(final)
        if not staged.exists():
            raise RunDirError(f"nothing staged for {final}")
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            staged.rename(final)
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        else:
            staged.rename(final)

    def check_layout(self, products: list[str] | tuple[str, ...] = ("persons", "units")) -> None:
        """Refuse a run directory where one of its folders is a file, or one of its files a folder."""
        folders = [STAGING, "invariants"] + [f"{top}/{p}" for top in ("histograms", "noisy_measurements", "mdf")
                                             for p in ("", *products)]
        files = ["manifest.json", "certificate.json", "spine.parquet"] + [f"invariants/{p}.parquet" for p in products]
        for name in folders:
            path = self.root / name
            if path.exists() and not path.is_dir():
                raise RunDirError(f"{path}: a file where the run directory needs a folder; remove it or choose "
                                  "another --out")
        for name in files:
            path = self.root / name
            if path.is_dir():
                raise RunDirError(f"{path}: a folder where the run directory needs a file; remove it or choose "
                                  "another --out")

    # -- manifest --------------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any]:
        """The manifest ({} when there is none); a corrupt or wrong-shaped one raises :class:`RunDirError`."""
        if not self.manifest_path.exists():
            return {}
        return read_manifest_file(self.manifest_path)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.manifest_path, manifest)


#: Manifest keys and the JSON types they must have (those the code reads back).
MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "status": str, "config_hash": str, "name": str, "algorithm": str, "spine": str, "levels": list, "products": list,
    "completed": dict, "parents_solved": dict, "failsafe": list, "timings": dict,
}


def read_manifest_file(path: Path) -> dict[str, Any]:
    """Read and shape-check a manifest.json; raises :class:`RunDirError` naming the file and the key."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(f"{path}: not a readable manifest ({type(exc).__name__}: {exc}); remove the run "
                          "directory or choose another --out") from None
    if not isinstance(manifest, dict):
        raise RunDirError(f"{path}: a manifest is a JSON object, found {type(manifest).__name__}")
    for key, kind in MANIFEST_TYPES.items():
        if key in manifest and not isinstance(manifest[key], kind):
            raise RunDirError(f"{path}: key '{key}' should be a JSON {_json_type(kind)}, found "
                              f"{_json_type(type(manifest[key]))} {manifest[key]!r:.60}")
    for key in ("levels", "products"):
        if not all(isinstance(v, str) for v in manifest.get(key, [])):
            raise RunDirError(f"{path}: key '{key}' should list names (strings)")
    for product, levels in manifest.get("completed", {}).items():
        if not isinstance(levels, list) or not all(isinstance(v, str) for v in levels):
            raise RunDirError(f"{path}: key 'completed.{product}' should list level names")
    return manifest


def _json_type(kind: type) -> str:
    return {str: "string", list: "array", dict: "object", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(kind, kind.__name__)


def writable_dir(path: Path, what: str) -> None:
    """Create ``path`` or check it is a writable folder; raises :class:`RunDirError` naming ``what``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RunDirError(f"{path}: cannot write {what} ({exc.strerror or exc})") from None


_LOCK_TEXT = re.compile(r"^pid (\d+) on (\S+)")


def _read_lock(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None


def _is_stale(holder: str) -> bool:
    """True when the lock text names a process of this host that no longer exists."""
    m = _LOCK_TEXT.match(holder)
    if m is None or m.group(2) != socket.gethostname():
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and an atomic rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_table(table: pa.Table | Any, path: Path) -> None:
    """Write a pandas frame or Arrow table as one Parquet file (directories created), deterministically and
    atomically (a temporary file renamed into place, so a killed run never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd", write_statistics=True)
    os.replace(tmp, path)
