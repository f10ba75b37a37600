"""Where files live: a local path, or an object in a store named by an fsspec URL (``s3://``, ``gs://``,
``abfs://``; ``file://`` is a local path).

:func:`location` turns what a user typed into a ``pathlib.Path`` (local: every file operation is exactly the
standard library's) or a :class:`StorePath`, which offers the part of ``Path``'s interface the run directory and
the input reader use, over fsspec. The few operations whose guarantees differ on a store (an atomic write, a
folder moved into place, a file created only if absent, file modes) are in :mod:`.rundir` and
:mod:`.private_files`, each with its store branch; everything else is written once for both.

A :class:`StorePath` holds its URL alone: pickled to a worker, it opens the store there with that process's
own credentials (each cloud's standard chain: environment, profile, instance role; a custom S3 endpoint through
``AWS_ENDPOINT_URL``). No credential is ever part of a path, a message or a file.
"""
from __future__ import annotations

import functools
import importlib
import logging
import posixpath
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import IO, Any, Iterator

from ..configuration.errors import ConfigError

#: URL scheme -> (the module that serves it, the optional extra that installs it).
SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"), "az": ("adlfs", "azure"),
}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
#: What every object written to an S3 store requests: server-side encryption (no ACL is set, so an object is
#: private to the bucket's owner unless the bucket policy says otherwise; docs/how-to/clusters.md "Object
#: storage").
S3_WRITE = {"ServerSideEncryption": "AES256"}

#: The loggers of the stores' clients.
CLIENT_LOGGERS = ("botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "azure")


class MissingExtra(ConfigError):
    """A URL's store needs an optional extra that is not installed (exit 2)."""


def is_url(path: object) -> bool:
    """Whether ``path`` names an object store (not a local path nor ``file://``)."""
    return isinstance(path, StorePath) or (isinstance(path, str) and bool(m := _URL.match(path))
                                           and m.group(1).lower() != "file")


def location(path: str | Path | "StorePath") -> Path | "StorePath":
    """A local ``Path`` (a path, or a ``file://`` URL) or a :class:`StorePath` (a store's URL); an unknown
    scheme, or one whose extra is missing, raises a :class:`ConfigError` naming it."""
    if isinstance(path, (Path, StorePath)):
        return path
    text = str(path)
    m = _URL.match(text)
    if m is None:
        return Path(text)
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "file":
        return Path(rest)
    if scheme not in SCHEMES:
        raise ConfigError(f"{text}: unknown storage scheme {scheme!r} (a local path, or a URL of "
                          f"{', '.join(sorted({f'{s}://' for s in SCHEMES}))} or file://)")
    key = rest.strip("/")
    if not key:
        raise ConfigError(f"{text}: a storage URL names a bucket or container (and a prefix in it)")
    filesystem(scheme)  # a missing extra is refused here, before anything is read or written
    return StorePath(scheme, key)


@functools.lru_cache(maxsize=None)
def filesystem(scheme: str):
    """The fsspec file system of ``scheme`` in this process (credentials from its standard chain)."""
    module, extra = SCHEMES[scheme]
    try:
        importlib.import_module(module)
        import fsspec
    except ImportError:
        raise MissingExtra(f"{scheme}:// URLs need the optional extra [{extra}]: pip install "
                           f"'census-topdown[{extra}]'") from None
    for client in CLIENT_LOGGERS:  # their DEBUG lines carry request headers (the access key's id): never emitted
        logger = logging.getLogger(client)
        logger.setLevel(max(logger.level, logging.INFO))
    options: dict[str, Any] = ({"s3_additional_kwargs": dict(S3_WRITE), "use_listings_cache": False}
                               if module == "s3fs" else {})
    return fsspec.filesystem(scheme, skip_instance_cache=True, **options)


class StorePath:
    """An object (or a prefix, a "folder") in a store: ``scheme://bucket/key``. Immutable, hashable, ordered by
    URL, pickled as its URL."""

    __slots__ = ("scheme", "key")

    def __init__(self, scheme: str, key: str):
        self.scheme, self.key = scheme, key.strip("/")

    # -- names -----------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"StorePath({str(self)!r})"

    def __reduce__(self):
        return StorePath, (self.scheme, self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorePath) and (self.scheme, self.key) == (other.scheme, other.key)

    def __hash__(self) -> int:
        return hash((self.scheme, self.key))

    def __lt__(self, other: "StorePath") -> bool:
        return self.key < other.key

    def __truediv__(self, name: str | PurePosixPath) -> "StorePath":
        return StorePath(self.scheme, posixpath.normpath(f"{self.key}/{name}"))

    @property
    def fs(self):
        return filesystem(self.scheme)

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.key).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.key).stem

    def as_posix(self) -> str:
        return str(self)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.key.split("/"))

    @property
    def parent(self) -> "StorePath":
        return StorePath(self.scheme, posixpath.dirname(self.key)) if "/" in self.key else self

    @property
    def parents(self) -> list["StorePath"]:
        out, p = [], self
        while "/" in p.key:
            p = p.parent
            out.append(p)
        return out

    def with_name(self, name: str) -> "StorePath":
        return self.parent / name

    def relative_to(self, other: "StorePath") -> PurePosixPath:
        if not isinstance(other, StorePath) or not (self.key + "/").startswith(other.key.rstrip("/") + "/") \
                and self.key != other.key:
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(posixpath.relpath(self.key, other.key))

    def resolve(self) -> "StorePath":
        return self

    absolute = resolve

    # -- queries ---------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.fs.exists(self.key)

    def is_file(self) -> bool:
        return self.fs.isfile(self.key)

    def is_dir(self) -> bool:
        return self.fs.isdir(self.key)

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> SimpleNamespace:
        """The object's size and modification time (``st_size``, ``st_mtime_ns``; 0 where the store gives none)."""
        size = int(self.fs.info(self.key).get("size") or 0)
        try:
            mtime = int(self.fs.modified(self.key).timestamp() * 1e9)
        except (NotImplementedError, AttributeError, ValueError):
            mtime = 0
        return SimpleNamespace(st_size=size, st_mtime_ns=mtime)

    def iterdir(self) -> Iterator["StorePath"]:
        if not self.is_dir():
            return iter(())
        return iter(sorted(StorePath(self.scheme, p) for p in self.fs.ls(self.key, detail=False)
                           if p.strip("/") != self.key))

    def rglob(self, pattern: str) -> Iterator["StorePath"]:
        """The objects below this prefix whose names match ``pattern`` (objects only: a store has no folders)."""
        found = self.fs.find(self.key) if self.is_dir() else []
        return iter(sorted(StorePath(self.scheme, p) for p in found if PurePosixPath(p).match(pattern)))

    def glob(self, pattern: str) -> Iterator["StorePath"]:
        return iter(sorted(StorePath(self.scheme, p) for p in self.fs.glob(f"{self.key}/{pattern}")))

    # -- contents --------------------------------------------------------------------------------
    def open(self, mode: str = "rb", **kwargs: Any) -> IO:
        return self.fs.open(self.key, mode, **kwargs)

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.key)

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def write_bytes(self, data: bytes) -> None:
        """One PUT: the object appears whole or not at all."""
        self.fs.pipe_file(self.key, data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def create(self, data: bytes) -> bool:
        """Write this object unless it exists, in one conditional request (S3's ``If-None-Match: *``; another
        store's exclusive-create mode): True when written, False when it was there. A store that cannot
        create conditionally raises NotImplementedError."""
        if SCHEMES[self.scheme][0] == "s3fs":
            bucket, _, key = self.key.partition("/")
            try:
                self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*", **S3_WRITE)
            except Exception as exc:  # s3fs translates botocore's errors; a refused condition is HTTP 412
                if _refused_condition(exc):
                    return False
                if _unknown_condition(exc):
                    raise NotImplementedError(f"{self}: the store cannot create an object only if absent") from None
                raise
            return True
        try:
            with self.fs.open(self.key, "xb") as fh:
                fh.write(data)
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError, TypeError):
            raise NotImplementedError(f"{self}: the store cannot create an object only if absent") from None
        return True

    def public(self) -> str | None:
        """Why the bucket of this path can be read by anyone (its policy or ACL says so), or None: private, or
        the store cannot tell (only S3 is asked; a bucket we may not inspect is taken as its owner set it)."""
        if SCHEMES[self.scheme][0] != "s3fs":
            return None
        bucket = self.key.partition("/")[0]
        try:
            status = self.fs.call_s3("get_bucket_policy_status", Bucket=bucket)
            if status.get("PolicyStatus", {}).get("IsPublic"):
                return f"the policy of bucket {bucket!r} makes it public"
        except Exception:  # no policy, or not allowed to read it
            pass
        try:
            grants = self.fs.call_s3("get_bucket_acl", Bucket=bucket).get("Grants", [])
        except Exception:
            return None
        everyone = [g for g in grants if g.get("Grantee", {}).get("URI", "").endswith(("/AllUsers",
                                                                                          "/AuthenticatedUsers"))]
        return f"the ACL of bucket {bucket!r} grants {everyone[0]['Permission']} to everyone" if everyone else None

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise
        self.fs.invalidate_cache(self.parent.key)

    def rmtree(self) -> None:
        """Remove every object below this prefix (nothing there: nothing to do)."""
        if self.fs.exists(self.key):
            self.fs.rm(self.key, recursive=True)
        self.fs.invalidate_cache()

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        """A store has no folders: a prefix exists once an object is below it."""

    def rmdir(self) -> None:
        """A store has no folders (nothing to remove)."""


def _refused_condition(exc: BaseException) -> bool:
    """An exception of a conditional PUT whose condition failed (the object exists)."""
    seen = {exc, exc.__cause__, exc.__context__} - {None}
    text = " ".join(f"{type(e).__name__} {e}" for e in seen)
    return isinstance(exc, FileExistsError) or "PreconditionFailed" in text or "412" in text \
        or "ConditionalRequestConflict" in text


def _unknown_condition(exc: BaseException) -> bool:
    """An exception of a conditional PUT the store or client does not know (NotImplemented, 501)."""
    seen = {exc, exc.__cause__, exc.__context__} - {None}
    text = " ".join(f"{type(e).__name__} {e}" for e in seen)
    return "NotImplemented" in text or "501" in text or "Unknown parameter" in text


def arrow(path: Path | StorePath) -> tuple[str, Any]:
    """``(source, filesystem)`` for pyarrow's readers: a local path as it is (filesystem None), a store's key
    with the store wrapped for Arrow."""
    if isinstance(path, StorePath):
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        return path.key, PyFileSystem(FSSpecHandler(path.fs))
    return str(path), None


def read_table(path: str | Path | StorePath, **options: Any):
    """``pyarrow.parquet.read_table`` of a Parquet file or folder, local or in a store."""
    import pyarrow.parquet as pq

    source, fs = arrow(location(path))
    return pq.read_table(source, filesystem=fs, **options)


def read_part(path: str | Path | StorePath):
    """One Parquet file read whole (a part of a run's level): on a store a single GET, where pyarrow's reader
    would first ask the store whether the key is a file and then its size (two more round trips)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = location(path)
    if isinstance(path, StorePath):
        return pq.read_table(pa.BufferReader(path.read_bytes()))
    return read_table(path)


def parquet_file(path: str | Path | StorePath):
    """``pyarrow.parquet.ParquetFile`` of a file, local or in a store."""
    import pyarrow.parquet as pq

    path = location(path)
    return pq.ParquetFile(path.open("rb")) if isinstance(path, StorePath) else pq.ParquetFile(path)


def read_schema(path: str | Path | StorePath):
    """``pyarrow.parquet.read_schema`` of a file, local or in a store."""
    import pyarrow.parquet as pq

    source, fs = arrow(location(path))
    return pq.read_schema(source, filesystem=fs)


def dataset(path: str | Path | StorePath, **options: Any):
    """``pyarrow.dataset.dataset`` of Parquet files (a file or a folder), local or in a store."""
    import pyarrow.dataset as ds

    source, fs = arrow(location(path))
    return ds.dataset(source, format="parquet", filesystem=fs, **options)


def scratch(folder: Path | StorePath, name: str) -> Path | StorePath:
    """Where a command that holds an output's lock keeps its intermediate files: ``folder/name``, emptied first;
    on a store, ``folder/name-<id>``, a prefix of this call's own (those of earlier calls, left by one that was
    killed, removed first). The caller removes it when done."""
    if not isinstance(folder, StorePath):
        shutil.rmtree(folder / name, ignore_errors=True)
        return folder / name
    for earlier in folder.glob(f"{name}-*"):
        earlier.rmtree()
    return folder / f"{name}-{uuid.uuid4().hex}"


def write_parquet(table: Any, path: str | Path | StorePath, **options: Any) -> None:
    """``pyarrow.parquet.write_table`` of ``table`` to a local file, or to a store's object in one PUT (it appears
    whole or not at all)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = location(path)
    if isinstance(path, StorePath):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **options)
        path.write_bytes(sink.getvalue().to_pybytes())
    else:
        pq.write_table(table, path, **options)


@contextmanager
def parquet_writer(path: str | Path | StorePath, schema: Any, **options: Any) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetWriter`` of a local file, or of a store's object put whole (one PUT) when the
    block ends without an error (nothing is put otherwise)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = location(path)
    if not isinstance(path, StorePath):
        with pq.ParquetWriter(path, schema, **options) as writer:
            yield writer
        return
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, **options) as writer:
        yield writer
    path.write_bytes(sink.getvalue().to_pybytes())


def read_frame(path: str | Path | StorePath, **options: Any):
    """``pandas.read_parquet`` of a Parquet file or folder, local or in a store."""
    import pandas as pd

    source, fs = arrow(location(path))
    return pd.read_parquet(source, filesystem=fs, **options)


def copy_files(src: Path | StorePath, dst: Path | StorePath) -> None:
    """Copy the file ``src``, or every file below the folder ``src``, to the same place under ``dst`` (within one
    store: server-side copies)."""
    files = [src] if src.is_file() else [f for f in src.rglob("*") if f.is_file()]
    for f in files:
        target = dst if f == src else dst / f.relative_to(src)
        if isinstance(f, StorePath) and isinstance(target, StorePath) and f.scheme == target.scheme:
            f.fs.copy(f.key, target.key)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())
