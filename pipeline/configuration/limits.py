"""The limits of what topdown accepts (docs/reference/exit-codes.md), in one place: every request is bounded, and one
beyond a limit is refused before any work with a configuration error (exit 2) of one line naming the file,
key or flag, the value and the limit.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import ConfigError

#: A configuration, census declaration or jobs file: a regular file (not a device, a FIFO or a folder) of at
#: most this many bytes.
MAX_FILE_BYTES = 16 * 2**20
#: Tables and arrays nested at most this deep in a TOML file (a census declaration needs 6).
MAX_DEPTH = 32
#: Files in a chain of ``include`` (the including file and the files it includes, directly or not).
MAX_INCLUDES = 16
#: A fraction as written (a budget, a share, delta): at most this many characters, and a decimal exponent
#: (``1e-5``) of at most this size either way, so that its numerator and denominator stay printable numbers.
MAX_NUMBER_CHARS = 100
MAX_EXPONENT = 400
#: A name (one component of a path) of at most this many bytes and a path of at most this many (Linux's limits).
NAME_MAX, PATH_MAX = 255, 4095
#: ``topdown synth``: persons (about 1.2 times the U.S. 2020 count) and blocks (about 1.2 times its blocks).
MAX_PERSONS = 400_000_000
MAX_BLOCKS = 10_000_000
#: ``topdown replicates --n``.
MAX_REPLICATES = 1_000
#: ``topdown audit --runs`` (runs on each of the two databases).
MAX_AUDIT_RUNS = 10_000
#: ``topdown batch --wait``: seconds, at most a week.
MAX_WAIT = 7 * 24 * 3600
#: The longest name (a run's, a batch job's, a level's, a product's) that becomes part of a path.
MAX_NAME = 100
#: A seed (``--seed``, ``[run] seed``): an integer from 0 to TOML's largest integer.
MAX_SEED = 2**63 - 1

_EXPONENT = re.compile(r"[eE]([+-]?\d+)")


def read_text(path: str | Path, what: str) -> str:
    """The text of ``path``, a regular file of at most :data:`MAX_FILE_BYTES` bytes of UTF-8 (``what`` names it in
    the error, e.g. "the configuration"). Opened without blocking and checked on the open file, so a FIFO, a
    device or a folder is refused without being read."""
    if not isinstance(path, (str, os.PathLike)):  # an object in a store (runtime/storage.py): no FIFO nor device
        try:
            size = path.fs.size(path.key)
            data = path.read_bytes() if size <= MAX_FILE_BYTES else b""
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: cannot read {what}: {size:,} bytes, above the limit of {MAX_FILE_BYTES:,}")
        return _utf8(data, path, what)
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: cannot read {what}: not a regular file (a folder, a device or a FIFO)")
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: cannot read {what}: {info.st_size:,} bytes, above the limit of "
                              f"{MAX_FILE_BYTES:,}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # grew since the check
        raise ConfigError(f"{path}: cannot read {what}: above the limit of {MAX_FILE_BYTES:,} bytes")
    return _utf8(data, path, what)


def _utf8(data: bytes, path: object, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read {what}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_toml_file(path: str | Path, what: str) -> dict:
    """A TOML file (:func:`read_text`) parsed, nested at most :data:`MAX_DEPTH` deep."""
    text = read_text(path, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        data = None
    if data is None or depth(data) > MAX_DEPTH:
        raise ConfigError(f"{path}: tables or arrays nested deeper than {MAX_DEPTH} levels")
    return data


def depth(value: Any) -> int:
    """How deep tables (dicts) and arrays (lists) nest in ``value`` (a scalar: 0), counted without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level + 1)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_number_text(text: str) -> None:
    """Raise ``ValueError`` (the caller names the key) when a number as written exceeds
    :data:`MAX_NUMBER_CHARS` characters or a decimal exponent of :data:`MAX_EXPONENT`: parsing ``"1e999999999"``
    exactly would not end, and ``"1e-5000"``'s denominator has more digits than Python prints."""
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    for exponent in _EXPONENT.findall(text):
        if abs(int(exponent)) > MAX_EXPONENT:
            raise ValueError(f"{text!r}: exponent {int(exponent)} is outside -{MAX_EXPONENT}..{MAX_EXPONENT}")


def check_count(value: int, flag: str, low: int, high: int) -> int:
    """``value`` of ``flag`` (e.g. ``--persons``) within ``low..high``, else a :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{flag} {value}: must be a whole number from {low:,} to {high:,}")
    return value


def check_seconds(value: float, flag: str, high: float) -> float:
    """A number of seconds from 0 to ``high`` (not NaN, not infinite), else a :class:`ConfigError`."""
    if not 0 <= value <= high:  # False for NaN
        raise ConfigError(f"{flag} {value}: must be a number of seconds from 0 to {high:,}")
    return value


def check_seed(value: int | None, flag: str = "--seed") -> int | None:
    """A seed from 0 to :data:`MAX_SEED` (None: no seed)."""
    return None if value is None else check_count(value, flag, 0, MAX_SEED)


def unsafe_name(name: str, what: str) -> str | None:
    """Why ``name`` cannot be part of a path (a folder's or file's name in an output), or None when it can: 1 to
    :data:`MAX_NAME` characters, not ``.`` or ``..``, no path separator or control character."""
    if not 1 <= len(name) <= MAX_NAME:
        return f"{what} {name[:40]!r}{'...' if len(name) > 40 else ''} should be 1 to {MAX_NAME} characters"
    if name in (".", "..") or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name):
        return f"{what} {name!r} would leave its folder (no '/', '\\', control characters, '.' or '..')"
    return None


def check_file_kind(value: str | os.PathLike, flag: str) -> None:
    """A path argument that exists is a regular file or a folder: a device, a FIFO or a socket (read, it would
    block or never end) is refused by name. Checked with ``stat``, without opening it."""
    try:
        mode = os.stat(value).st_mode
    except (OSError, ValueError):
        return  # absent or unreadable: the command says so where it reads it
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ConfigError(f"{flag} {os.fsdecode(value)}: not a regular file or a folder (a device, a FIFO or a "
                          "socket)")


def check_path(value: str | os.PathLike, flag: str) -> None:
    """A path argument whose names fit the file system's limits (:data:`NAME_MAX` bytes each, :data:`PATH_MAX`
    in all); longer ones are refused by name instead of failing with ENAMETOOLONG somewhere in the command."""
    raw = os.fsencode(value)
    if len(raw) > PATH_MAX:
        raise ConfigError(f"{flag}: a path of {len(raw):,} bytes (at most {PATH_MAX:,})")
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        shown = os.fsdecode(longest)
        raise ConfigError(f"{flag}: the name {shown[:40]!r}... is {len(longest)} bytes long (at most {NAME_MAX} "
                          "per name)")
