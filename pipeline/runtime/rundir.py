"""The run directory: layout, one-writer lock, atomic level writes, and the manifest.

Layout::

    manifest.json          the directory's marker (format "census-topdown", command, output_id), status, levels
                           (top-down), config hash, SHA-256 of every input file, seed mode,
                           budgets, timings, parents solved per level, parents that needed the failsafe,
                           SHA-256 of every committed level's files (sha256) and of the configuration,
                           certificate, spine, invariants and MDF files (output_sha256)
    certificate.json       privacy accounting (rho as an exact fraction, epsilon at delta, per level/query;
                           earlier draws of this directory and their composition, see --redraw)
    config.json            the resolved configuration, with its census declaration (its digest is the manifest's
                           config hash)
    spine.parquet          geoid + one column per level (the node of each block at that level)
    invariants/<product>.parquet            declared-public invariants: unit and GQ-facility counts of every node,
                                            the US total, each whole state's total (level "whole_state")
    noisy_measurements/<product>/level=<L>/ geocode, query, answer, value, variance
    histograms/<product>/level=<L>/         geocode, cell, count
    mdf/<product>/county=<SSCCC>/           one row per person / unit, tabulation geography

Every directory is written under ``.staging/`` and renamed into place when complete, so a reader
never sees half a level. On an object store (:mod:`.storage`), which has no rename, a folder is written in place
object by object (each object whole, in one PUT) and the manifest, written last, lists what is complete with its
SHA-256: a reader trusts only what the manifest lists. :class:`RunReader` is the one reader of a run directory (verify, evaluate, the CLI,
reprocessing, the noisy measurement file): its paths, its typed :class:`Manifest` and :class:`Certificate`
(both carry ``schema_version``), its spine and its tables.
"""
from __future__ import annotations

import errno
import ctypes
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..configuration.limits import read_text, unsafe_name
from .storage import StorePath, arrow, location, write_parquet

log = logging.getLogger("topdown")

STAGING = ".staging"
LOCK = ".lock"
#: Version of the layout of manifest.json and certificate.json (written as ``schema_version``; a file without
#: it is version 1, the layout before the key was written).
SCHEMA_VERSION = 1
#: Everything a run writes into its directory besides its manifest (a fresh run removes these, and nothing else,
#: first).
OUTPUTS = ("certificate.json", "config.json", "spine.parquet", "invariants", "noisy_measurements", "histograms", "mdf",
           STAGING)
#: The published part of a run that post-processing reads (reprocess, nmf): the measurements and what they were
#: measured with. Each file is checked against the run's recorded SHA-256 before it is used (:meth:`RunReader.check_sums`).
MEASURED = ("config.json", "certificate.json", "spine.parquet", "invariants", "noisy_measurements")


class RunDirError(RuntimeError):
    """The run directory cannot be used (locked, not writable, or inconsistent)."""


class LevelsMismatch(RunDirError):
    """The manifest's levels are not the levels of the run's census: every path below the run is named by them,
    so nothing of the run can be read."""


class RunDir:
    """Paths and atomic writes inside one run directory."""

    def __init__(self, root: str | Path | StorePath):
        self.root = location(root)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def config_path(self) -> Path:
        """The resolved configuration the run used (JSON; ``Config.digest`` of it is the manifest's config hash)."""
        return self.root / "config.json"

    def histograms(self, product_name: str, level: str) -> Path:
        return self.root / "histograms" / product_name / f"level={level}"

    def measurements(self, product_name: str, level: str) -> Path:
        return self.root / "noisy_measurements" / product_name / f"level={level}"

    def mdf(self, product_name: str) -> Path:
        return self.root / "mdf" / product_name

    def invariants(self, product_name: str) -> Path:
        return self.root / "invariants" / f"{product_name}.parquet"

    def output_digests(self, products: list[str]) -> dict[str, str]:
        """SHA-256 of every run-wide output, by path in the run directory (the manifest's ``output_sha256``):
        configuration, certificate, spine, and per product its invariants and MDF. The files of each level
        are recorded per level (:func:`level_digests`, the manifest's ``sha256``)."""
        files = [self.config_path, self.root / "certificate.json", self.root / "spine.parquet"]
        for product in products:
            files += [self.invariants(product), *sorted(self.mdf(product).rglob("*"))]
        return {str(f.relative_to(self.root)): sha256_file(f) for f in files if f.is_file()}

    def chunk_records(self, product_name: str, level: str) -> Path:
        """Where a level's finished chunks are recorded while it runs (for --resume inside a level)."""
        return self.root / STAGING / "chunks" / product_name / f"level={level}"

    def staging(self, final: Path) -> Path:
        """Where a file or folder is written before :meth:`commit` puts it in place: on local disk its staging
        twin (same relative path under ``.staging``), renamed into place whole; on a store, which has no rename,
        ``final`` itself (each object appears whole, in one PUT, and the manifest, written after, is what a
        reader trusts: a level or file it does not list as complete is not part of the run)."""
        if isinstance(self.root, StorePath):
            return final
        return self.root / STAGING / final.relative_to(self.root)

    def clear_place(self, final: Path, keep: Iterable[str] = ()) -> None:
        """Before a folder is written into its staging place: on a store, remove the objects an earlier version
        left below ``final`` but those named ``keep`` (an interrupted level's finished parts), so that the folder
        holds the new version alone; on local disk nothing (the staging twin replaces ``final`` whole)."""
        if not isinstance(final, StorePath):
            return
        kept = set(keep)
        stale = [f for f in final.rglob("*") if f.relative_to(final).as_posix() not in kept]
        if stale:
            final.fs.rm([f.key for f in stale])

    # -- lifecycle -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the directory or check it is writable (nothing else is touched before the lock)."""
        writable_dir(self.root, "the run directory")

    def clear_staging(self) -> None:
        """Remove half-written output of an interrupted run (call only while holding the lock)."""
        remove_tree(self.root / STAGING)

    def write_marker(self, marker: dict[str, str]) -> None:
        """Write a manifest that holds the run's marker alone (``outdir.read_marker``: a run not yet started)."""
        self.write_manifest({"schema_version": SCHEMA_VERSION, **marker})

    def clear_outputs(self, marker: dict[str, str]) -> None:
        """Remove every output of an earlier run (call only while holding the lock), the manifest first reduced
        to the run's ``marker``: nothing of another configuration or product survives a fresh run, and no
        reader takes what is left for the earlier run."""
        self.write_marker(marker)
        for name in OUTPUTS:
            path = self.root / name
            if path.is_dir() and not path.is_symlink():
                remove_tree(path, strict=True)
            else:
                path.unlink(missing_ok=True)

    def measured_levels(self) -> dict[str, list[str]]:
        """Per product, the levels whose noisy measurements are in place (released)."""
        base = self.root / "noisy_measurements"
        found = {p.name: sorted(d.name.removeprefix("level=") for d in p.glob("level=*"))
                 for p in sorted(base.iterdir()) if p.is_dir()} if base.is_dir() else {}
        return {product: levels for product, levels in found.items() if levels}

    def lock(self) -> AbstractContextManager[None]:
        """Hold the one-writer lock of this run directory (:func:`held`)."""
        return held(self.root / LOCK, self.root, "run")

    def commit(self, final: Path) -> None:
        """Move a staged file or directory into place, replacing any earlier version."""
        staged = self.staging(final)
        if not staged.exists():
            raise RunDirError(f"nothing staged for {final}")
        if staged == final:  # a store: written in place
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            staged.rename(final)
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        else:
            staged.rename(final)

    def check_layout(self, products: list[str] | tuple[str, ...]) -> None:
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
    "format": str, "command": str, "output_id": str,
    "status": str, "config_hash": str, "name": str, "algorithm": str, "spine": str, "levels": list, "products": list,
    "completed": dict, "parents_solved": dict, "failsafe": list, "timings": dict, "sha256": dict, "output_sha256": dict,
}


def read_manifest_file(path: Path) -> dict[str, Any]:
    """Read and shape-check a manifest.json; raises :class:`RunDirError` naming the file and the key."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
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
    names = [(key, v) for key in ("levels", "products") for v in manifest.get(key, [])]
    for product, levels in manifest.get("completed", {}).items():
        names += [("completed", product)] + [(f"completed.{product}", v) for v in levels]
    for key, name in names:  # each becomes a folder's name (histograms/<product>/level=<level>)
        if (why := unsafe_name(name, "name")) is not None:
            raise RunDirError(f"{path}: key '{key}': {why}")
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


class Locked(RunDirError):
    """The output is held by another writer: ``holder`` is what its lock file ``path`` says."""

    def __init__(self, message: str, path: Path, holder: str):
        super().__init__(message)
        self.path, self.holder = path, holder


@contextmanager
def held(path: Path, output: Path, owner: str) -> Iterator[None]:
    """Hold the one-writer lock file ``path`` of the output ``output`` (``owner``: the kind of writer a refusal
    names, e.g. "run").

    The lock file records ``pid <pid> on <host> since <time>``. A lock left by a process of this host that no
    longer exists (a killed command), or an empty one, is stale and taken over, with a warning in the log; a
    lock of another host, or of a live process, refuses the writer (:class:`Locked`) with a message naming the
    holder.
    """
    text = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}"
    if not _try_create(path, text):
        holder = _read_lock(path)
        if holder is not None and _is_stale(holder):
            _take_over(path, holder, output)
        if not _try_create(path, text):
            raise _locked(path, output, owner, _read_lock(path) or "holder unknown")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def refuse_if_held(path: Path, output: Path, owner: str) -> None:
    """Raise :class:`Locked` (as :func:`held` would) when the lock file ``path`` is held by a live writer."""
    holder = _read_lock(path)
    if holder is not None and not _is_stale(holder):
        raise _locked(path, output, owner, holder)


def _locked(path: Path, output: Path, owner: str, holder: str) -> Locked:
    return Locked(f"{output} is locked by another {owner} ({holder}). If none is active, delete {path}.", path, holder)


def _try_create(path: Path | StorePath, text: str) -> bool:
    """Create the lock file holding ``text`` unless one exists: written beside it and linked into place
    (atomic, so a lock file is never empty; a full disk leaves no lock). On a store: one conditional PUT."""
    if isinstance(path, StorePath):
        try:
            return path.create(text.encode())
        except NotImplementedError as exc:
            raise RunDirError(f"{exc}: the one-writer lock cannot be held there; nothing was written (use a store "
                              "with conditional writes, or a local --out)") from None
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with writing(path):
            tmp.write_text(text)
            os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _take_over(path: Path, holder: str, output: Path) -> None:
    """Move a stale lock aside (atomic rename) and delete it if it is still the one judged stale. A store has
    no rename: the lock is deleted if it still holds the stale text (a writer that took it over in the moment
    between the read and the delete loses it; the conditional create after decides between the rest)."""
    if isinstance(path, StorePath):
        if _read_lock(path) == holder:
            path.unlink(missing_ok=True)
            log.warning("%s: took over the stale lock of a writer that no longer exists (%s)", output, holder)
        return
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another process took it over first; the O_EXCL create decides
    if _read_lock(aside) != holder:  # a fresh lock replaced the stale one meanwhile: put it back
        os.rename(aside, path)
        return
    aside.unlink(missing_ok=True)
    log.warning("%s: took over the stale lock of a writer that no longer exists (%s)", output, holder)


_LOCK_TEXT = re.compile(r"^pid (\d+) on (\S+)")


def _read_lock(path: Path) -> str | None:
    """The text of the lock file ``path`` (None: none there, or not a readable file)."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _is_stale(holder: str) -> bool:
    """True when the lock text names a process of this host that no longer exists, or is empty (a lock is
    linked into place whole, so an empty one was left by an earlier version that ran out of disk writing it)."""
    if not holder:
        return True
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
    with location(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def changed_files(recorded: dict[str, str], found: dict[str, str]) -> dict[str, str]:
    """Per path, how a file differs from the SHA-256 sums ``recorded`` for it (``found``: the sums now): missing,
    changed, or not recorded (added since); {} when every file matches."""
    problems = {}
    for path in sorted(recorded.keys() | found.keys()):
        if recorded.get(path) != found.get(path):
            problems[path] = ("missing" if path not in found else "not recorded in the manifest (added since the run)"
                              if path not in recorded else "SHA-256 differs from the manifest")
    return problems


def level_digests(rundir: RunDir, product_name: str, level: str) -> dict[str, str]:
    """SHA-256 of every file of a committed level (measurements and histograms), by path in the run directory."""
    dirs = (rundir.measurements(product_name, level), rundir.histograms(product_name, level))
    return {str(f.relative_to(rundir.root)): sha256_file(f) for d in dirs for f in sorted(d.rglob("*")) if f.is_file()}


#: errno values of a write refused by the place written (full, read-only, not permitted, over a size
#: limit): an error of the run directory or --out (exit 4), not a bug.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


#: errno values of a path that cannot be made because a file stands where a folder belongs (or the reverse).
IN_THE_WAY_ERRNOS = frozenset({errno.ENOTDIR, errno.EEXIST, errno.EISDIR})


def unwritable(exc: BaseException, path: str | Path | None, out: str | Path | None = None) -> RunDirError | None:
    """The :class:`RunDirError` of a write to ``path`` (default: the exception's file) refused with ``exc``, or of
    a file in the way of a path beside or under the command's ``out`` (its temporary siblings; None: another
    error)."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno in WRITE_ERRNOS:
        return RunDirError(f"{path or exc.filename or 'output'}: cannot write ({os.strerror(exc.errno)})")
    if exc.errno in IN_THE_WAY_ERRNOS and out and exc.filename and _within(Path(exc.filename), Path(out).parent):
        return RunDirError(f"{out}: cannot write {exc.filename} ({os.strerror(exc.errno)}: a file or folder is in "
                           "the way)")
    return None


def _within(path: Path, folder: Path) -> bool:
    """``path`` is ``folder`` or lies under it (both taken as given and as absolute paths)."""
    path, folder = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    return path == folder or folder in path.parents


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """A write to ``path``: refused by the place written, it raises :class:`RunDirError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        error = unwritable(exc, path)
        if error is None:
            raise
        raise error from None


@contextmanager
def removed_on_failure(path: str | Path) -> Iterator[None]:
    """Whatever is written at ``path`` (a file or a folder) is removed if the block fails: nothing half-written."""
    path = location(path)
    try:
        yield
    except BaseException:
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        else:
            with suppress(OSError):  # e.g. a file where a folder of ``path`` belongs: nothing was written
                path.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and an atomic rename (on a store: one PUT, as atomic)."""
    path = location(path)
    if isinstance(path, StorePath):
        with writing(path):
            path.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
        return
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path), removed_on_failure(tmp):
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, path)


def remove_tree(path: Path | StorePath, strict: bool = False) -> None:
    """Remove the folder ``path`` and everything below it (errors ignored unless ``strict``)."""
    if isinstance(path, StorePath):
        path.rmtree()
    else:
        shutil.rmtree(path, ignore_errors=not strict)


def replace_dir(new: Path, final: Path) -> None:
    """Put the complete folder ``new`` in the place of ``final`` atomically: ``final`` holds its old contents or
    the new ones at every moment (Linux renameat2 RENAME_EXCHANGE; elsewhere two renames, the old folder kept
    beside as ``.<name>.old`` in between). ``new`` is gone afterwards."""
    if not final.exists():
        os.rename(new, final)
        return
    if _exchange(new, final):
        shutil.rmtree(new)  # now the old contents
        return
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(final, old)
    os.rename(new, final)
    shutil.rmtree(old)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one system call (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    rename2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return rename2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def write_table(table: pa.Table | Any, path: Path, **options: Any) -> None:
    """Write a pandas frame or Arrow table as one Parquet file (directories created), deterministically and
    atomically (a temporary file renamed into place, so a killed run never leaves half a file); ``options``
    go to ``pq.write_table`` (e.g. ``measure.MEASUREMENT_PARQUET``)."""
    path = location(path)
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    if isinstance(path, StorePath):
        with writing(path):
            write_parquet(table, path, **{"compression": "zstd", "write_statistics": True, **options})
        return
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path), removed_on_failure(tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp, **{"compression": "zstd", "write_statistics": True, **options})
        os.replace(tmp, path)


#: Rows in a row group of a Parquet file written by :func:`write_table` (pyarrow's default for a table).
ROW_GROUP_ROWS = 1024 * 1024


def write_frames(frames: Iterable[Any], path: Path, rows_per_group: int = ROW_GROUP_ROWS) -> None:
    """Write pandas frames one after the other as one Parquet file: the bytes :func:`write_table` writes of
    their concatenation, without holding it (a row group at a time; the schema is the first frame's, whose
    columns must have the concatenation's types). Atomic like :func:`write_table`."""
    path = location(path)
    store = isinstance(path, StorePath)
    tmp = pa.BufferOutputStream() if store else path.with_name(f".{path.name}.tmp")
    with writing(path), removed_on_failure(path if store else tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        writer, schema, pending, held = None, None, [], 0
        try:
            for frame in frames:
                table = pa.Table.from_pandas(frame, preserve_index=False, schema=schema)
                if writer is None:
                    schema = table.schema
                    writer = pq.ParquetWriter(tmp, schema, compression="zstd", write_statistics=True)
                pending.append(table)
                held += table.num_rows
                while held >= rows_per_group:
                    joined = pa.concat_tables(pending)
                    writer.write_table(joined.slice(0, rows_per_group).combine_chunks(), row_group_size=rows_per_group)
                    pending, held = [joined.slice(rows_per_group)], held - rows_per_group
            if writer is None:
                raise ValueError(f"{path}: no frame to write")
            if held:
                writer.write_table(pa.concat_tables(pending).combine_chunks(), row_group_size=rows_per_group)
        finally:
            if writer is not None:
                writer.close()
        if store:
            path.write_bytes(tmp.getvalue().to_pybytes())
        else:
            os.replace(tmp, path)


def _schema_version(data: dict[str, Any], path: Path) -> int:
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise RunDirError(f"{path}: key 'schema_version' is {version!r}; this version of topdown reads versions "
                          f"1 to {SCHEMA_VERSION}")
    return version


@dataclass(frozen=True)
class Manifest:
    """A run's manifest.json, typed (the keys the code reads back; ``data`` keeps the whole object)."""

    path: Path
    schema_version: int
    status: str
    name: str
    algorithm: str
    spine: str
    levels: list[str]
    products: list[str]
    seed: int | None
    completed: dict[str, list[str]] = field(default_factory=dict)
    parents_solved: dict[str, Any] = field(default_factory=dict)
    failsafe: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        """Read and check manifest.json; raises :class:`RunDirError` naming the file and the key."""
        data = read_manifest_file(path)
        return cls(path, _schema_version(data, path), data.get("status", ""), data.get("name", ""),
                   data.get("algorithm", "topdown"), data.get("spine", "standard"), list(data.get("levels", [])),
                   list(data.get("products", [])), data.get("seed"), data.get("completed", {}),
                   data.get("parents_solved", {}), data.get("failsafe", []), data)

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def level_sha256(self, product_name: str, level: str) -> dict[str, str] | None:
        """The SHA-256 of each file of one level, by path in the run directory (None: none recorded)."""
        per_product = (self.data.get("sha256") or {}).get(product_name)
        sums = per_product.get(level) if isinstance(per_product, dict) else None
        return sums if isinstance(sums, dict) else None

    def recorded_sha256(self) -> dict[str, str]:
        """Every SHA-256 the manifest records, by path: each level's files and the run-wide outputs."""
        recorded: dict[str, str] = {}
        for product in self.products:
            for level in self.levels:
                recorded.update(self.level_sha256(product, level) or {})
        recorded.update(self.data.get("output_sha256") or {})
        return recorded


@dataclass(frozen=True)
class Certificate:
    """A run's certificate.json, typed: run-wide fields and one entry per product (``certificate.py`` writes it)."""

    path: Path
    schema_version: int
    run: str
    mode: str
    private: bool
    products: dict[str, dict[str, Any]]
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, path: Path) -> "Certificate":
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RunDirError(f"{path}: not a readable certificate ({type(exc).__name__}: {exc})") from None
        if not isinstance(data, dict):
            raise RunDirError(f"{path}: a certificate is a JSON object, found {type(data).__name__}")
        return cls(path, _schema_version(data, path), str(data.get("run", "")), str(data.get("mode", "")),
                   bool(data.get("private", False)),
                   {n: e for n, e in data.items() if isinstance(e, dict) and e.get("product") == n},
                   data)


def _older(config: Any) -> str:
    """A hint for a config.json that names its census by a path (a run of an older version): where it reads."""
    run = config.get("run") if isinstance(config, dict) else None
    census = run.get("census") if isinstance(run, dict) else None
    if not isinstance(census, str) or "census" in config:
        return ""
    return (f"; a run of an older version names its census by the path {census!r}: run the command from the folder "
            "that path is relative to (runs of this version carry their census)")


class RunReader(RunDir):
    """Reads a run directory: typed manifest and certificate, the spine, the configuration and output tables."""

    def manifest(self) -> Manifest:
        """The manifest; raises :class:`RunDirError` when the folder or its manifest is missing or malformed."""
        if not self.root.is_dir():
            raise RunDirError(f"{self.root}: no such run directory")
        if not self.manifest_path.is_file():
            raise RunDirError(f"{self.root}: no manifest.json (not a run directory, or a run that never started)")
        return Manifest.read(self.manifest_path)

    def complete_manifest(self, action: str = "verifying it") -> Manifest:
        """The manifest of a complete run; raises :class:`RunDirError` when there is none."""
        manifest = self.manifest()
        if not manifest.complete:
            raise RunDirError(f"{self.root}: holds no complete run (manifest status {manifest.status!r}); finish it "
                              f"with `topdown run --resume` before {action}")
        missing = [k for k in ("levels", "products") if k not in manifest.data]
        if missing:
            raise RunDirError(f"{self.manifest_path}: key '{missing[0]}' missing")
        return manifest

    def check_sums(self, names: tuple[str, ...], action: str) -> None:
        """Every file below the run's entries ``names`` (e.g. ``noisy_measurements``, ``spine.parquet``) that
        the manifest records a SHA-256 for still has it, and none was added beside them; raises
        :class:`RunDirError` naming the first that differs, so ``action`` stops before it writes anything.
        Entries without recorded sums (a run of an older version) are read unchecked, with a warning."""
        recorded = {path: s for path, s in self.manifest().recorded_sha256().items() if Path(path).parts[0] in names}
        covered = sorted({Path(path).parts[0] for path in recorded})
        found: dict[str, str] = {}
        for name in covered:
            top = self.root / name
            files = [top] if top.is_file() else sorted(f for f in top.rglob("*") if f.is_file())
            found.update({str(f.relative_to(self.root)): sha256_file(f) for f in files})
        problems = changed_files(recorded, found)
        if problems:
            path = next(iter(problems))
            raise RunDirError(f"{self.root / path}: {problems[path]}; {action} reads only the files the run wrote "
                              f"and stops (nothing written). `topdown verify {self.root}` lists every difference")
        if unchecked := [n for n in names if n not in covered and (self.root / n).exists()]:
            log.warning("%s: the manifest records no SHA-256 for %s (a run of an older version); read unchecked",
                        self.root, ", ".join(unchecked))

    @property
    def certificate_path(self) -> Path:
        return self.root / "certificate.json"

    @property
    def spine_path(self) -> Path:
        return self.root / "spine.parquet"

    def certificate(self) -> Certificate:
        return Certificate.read(self.certificate_path)

    def spine(self):
        """The run's own spine with its budget moves (``spine.parquet`` carries kind, levels and moves; a run of
        an older version wrote none: only a standard spine, which moves no budget, can be read back from it)."""
        from topdown.geo import GeographyError
        from topdown.geo.spine import Spine

        manifest = self.manifest()
        standard = manifest.spine == "standard"
        try:
            source, fs = arrow(self.spine_path)
            return Spine.read_parquet(source, standard_levels=manifest.levels if standard else None, filesystem=fs)
        except GeographyError as exc:
            older = "" if standard else (f" (a run of an older version records no budget moves for the "
                                         f"{manifest.spine!r} spine: rerun with this version)")
            raise RunDirError(f"{exc}{older}") from None

    def config(self):
        """The configuration a complete run used: its ``config.json`` (which carries the census declaration
        itself), else the manifest's source file if its digest still matches the manifest's config hash. Raises
        :class:`RunDirError` when it cannot be read, does not match the config hash, or declares other levels than
        the manifest's."""
        from ..configuration.config import ConfigError, config_from_dict, load_config

        manifest = self.manifest() if self.manifest_path.exists() else None
        if manifest is None or not manifest.complete:
            raise RunDirError(f"{self.root}: not a complete run directory (manifest status "
                              f"{manifest.status if manifest else 'missing'!r})")
        if self.config_path.exists():
            data = None
            try:
                data = json.loads(read_text(self.config_path, "the run's configuration"))
                config = config_from_dict(data if isinstance(data, dict) else {}, source=str(self.config_path))
            except (OSError, ValueError, RecursionError) as exc:  # ConfigError, JSON or UTF-8 errors included
                why = str(exc).removeprefix(f"{self.config_path}: ")
                raise RunDirError(f"{self.config_path}: the run's configuration cannot be read ({why}){_older(data)}"
                                  ) from None
        else:
            source = manifest.data.get("config_source", "")
            try:
                config = load_config(source)
            except (ConfigError, FileNotFoundError, OSError):
                raise RunDirError(f"{self.root}: no config.json and the configuration {source!r} cannot be read") from None
        if not config.matches(manifest.data.get("config_hash")):
            raise RunDirError(f"{self.root}: configuration {config.source} does not match the run's config hash "
                              f"{manifest.data.get('config_hash', '?')[:12]}")
        names = list(config.census.hierarchy.names)
        if manifest.levels != names:
            raise LevelsMismatch(f"{manifest.path}: levels {manifest.levels} are not the levels of census "
                              f"{config.census.name!r} ({', '.join(names)})")
        return config

    def census(self):
        """The run's census (``vocab.census.Census``), as its configuration declares it. A run without a readable
        configuration whose manifest has the default census's levels is read as one of the default census
        (P.L. 94-171: a run of an older version, or one whose config.json was lost, which verify reports); any
        other raises :class:`RunDirError` saying why."""
        from ..configuration.census import default_census

        try:
            return self.config().census
        except RunDirError:
            census = default_census()
            if self.manifest().levels != list(census.hierarchy.names):
                raise
            return census

    def products(self) -> list:
        """The run's products (``vocab.census.Product``) in the manifest's order (:meth:`census`)."""
        names = self.manifest().products
        return sorted((p for p in self.census().products if p.name in names), key=lambda p: names.index(p.name))

    def hierarchy(self):
        """The run's geographic hierarchy (``vocab.census.Hierarchy``, :meth:`census`)."""
        return self.census().hierarchy

    def spine_table(self):
        """``spine.parquet`` as a frame of strings (geoid + one column per level)."""
        return self.table(self.spine_path).astype(str)

    def table(self, path: Path | StorePath, columns: list[str] | None = None):
        """A Parquet file or folder of this run as a frame."""
        source, fs = arrow(path)
        return pq.read_table(source, columns=columns, filesystem=fs).to_pandas()

