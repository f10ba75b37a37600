"""Where a command writes: the one rule of every ``--out``.

* **Nothing of the user's is touched.** A command writes its output (a folder; a file for ``uncertainty``,
  ``privacy --out`` and a batch's summary) only where the path is absent, an empty folder, or an earlier output
  of the same command as that output's own marker says: the project's format name, the command and, for a
  folder, the id it was given when it was made (:func:`read_marker`). A folder's marker is
  :data:`MARKER` in it, a run directory's its ``manifest.json``; a file carries it inside (a JSON key, Parquet
  metadata). Anything else is refused (:class:`RunDirError`, exit 4) before it is touched.
* **Nothing confidential lands in a published tree.** No output goes inside a run directory (its files are
  the run's alone; ``topdown verify`` fails on any other), and a confidential output (one computed from true
  counts, :data:`WRITERS`) never lies in or under a published output nor holds one, whatever ``--out`` says.
* **One writer per output**, by the run's lock rules (:func:`rundir.held`): ``.lock`` in a folder, ``.<name>.lock``
  beside a file.

:func:`claimed` and :func:`claimed_file` apply all three; :func:`check` applies the first two without writing
(a command that reads its input first refuses a bad ``--out`` before that work).
"""
from __future__ import annotations

import functools
import json
import os
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pyarrow.parquet as pq

from .private_files import private_dir, private_file
from .rundir import (LOCK, RunDir, RunDirError, held, read_manifest_file, refuse_if_held, remove_tree,
                     removed_on_failure, replace_dir, writable_dir, write_json_atomic, writing)
from .storage import StorePath, location

#: The project's format name in every marker.
FORMAT = "census-topdown"
#: A folder's marker (a run directory's is its manifest.json).
MARKER = ".topdown-output.json"
#: The key of the marker inside a file output (a JSON object's key, a Parquet file's metadata key).
MARKER_KEY = "topdown_output"
_ID = re.compile(r"[0-9a-f]{32}")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Writer:
    """What a command writes: its name in messages, whether it holds true (confidential) counts, whether an
    earlier output of it is written over (else only an absent or empty folder is taken)."""

    what: str
    confidential: bool = False
    replaces: bool = True


#: Every command that writes, by the name its marker records.
WRITERS: dict[str, Writer] = {
    "run": Writer("the run directory"),
    "reprocess": Writer("the run directory"),
    "replicates": Writer("the replicates"),
    "nmf": Writer("the noisy measurement file", replaces=False),
    "uncertainty": Writer("the uncertainty table"),
    "spine": Writer("the spine report"),
    "privacy": Writer("the certificate"),
    "batch": Writer("the batch's logs and summary"),
    "synth": Writer("the synthetic input", replaces=False),
    "evaluate": Writer("the evaluation", confidential=True),
    "audit": Writer("the audit", confidential=True),
    "ingest": Writer("the input", confidential=True),
    "demo-data": Writer("the demo input", confidential=True),
}
#: The commands whose output is a run directory.
RUN_COMMANDS = frozenset({"run", "reprocess"})
#: A marker's keys (a run's manifest holding these and ``schema_version`` alone is a run not yet started).
MARKER_FIELDS = ("format", "command", "output_id")


def new_marker(command: str) -> dict[str, str]:
    """The marker of a new folder output of ``command``."""
    return {"format": FORMAT, "command": command, "output_id": uuid.uuid4().hex}


def file_marker(command: str) -> dict[str, str]:
    """The marker a file output of ``command`` carries inside (under :data:`MARKER_KEY`)."""
    return {"format": FORMAT, "command": command}


def _valid(obj: Any, folder: bool) -> dict[str, str] | None:
    """The marker in ``obj`` (format, command and, for a folder, its id), or None."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("command") not in WRITERS:
        return None
    if folder and not (isinstance(obj.get("output_id"), str) and _ID.fullmatch(obj["output_id"])):
        return None
    return {k: obj[k] for k in MARKER_FIELDS if k in obj}


def _json(path: Path) -> Any:
    """The JSON in a regular file, or None (absent, not a regular file, unreadable, not JSON)."""
    try:
        if not path.is_file() or path.is_symlink():
            return None
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def read_marker(path: Path) -> dict[str, str] | None:
    """The marker of the output at ``path`` (None: it carries none). A run directory's is its manifest's;
    a manifest.json that cannot be read raises :class:`RunDirError` naming it."""
    path = location(path)
    if path.is_dir():
        own = _valid(_json(path / MARKER), folder=True)
        if own is not None or not (path / "manifest.json").is_file():
            return own
        marker = _valid(read_manifest_file(path / "manifest.json"), folder=True)
        return marker if marker is not None and marker["command"] in RUN_COMMANDS else None
    if not path.is_file():
        return None
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
            fh.seek(0)
            schema = pq.read_schema(fh) if head == b"PAR1" else None
        if schema is not None:
            meta = (schema.metadata or {}).get(MARKER_KEY.encode())
            return _valid(json.loads(meta), folder=False) if meta else None
    except (OSError, ValueError, RuntimeError):  # pyarrow's errors are OSError/ValueError subclasses
        return None
    obj = _json(path)
    return _valid(obj.get(MARKER_KEY), folder=False) if isinstance(obj, dict) else None


def _published(folder: Path) -> str | None:
    """What published output ``folder`` is ("the run directory", "the noisy measurement file"...), or None. A
    manifest.json with a status is taken for a run's (one of an earlier version, or something like one), so
    that nothing is written into it."""
    manifest = _json(folder / "manifest.json")
    if isinstance(manifest, dict) and ("status" in manifest or _valid(manifest, folder=True) is not None):
        return "the run directory"
    marker = _valid(_json(folder / MARKER), folder=True)
    if marker is not None and not WRITERS[marker["command"]].confidential:
        return WRITERS[marker["command"]].what
    return None


def _ancestors(path: Path) -> list[Path]:
    """The folders above ``path``, as written and with links resolved (nearest first)."""
    if isinstance(path, StorePath):
        return path.parents
    literal = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    seen: list[Path] = []
    for folder in (*literal.parents, *real.parents):
        if folder not in seen:
            seen.append(folder)
    return seen


def _refuse_published(path: Path, command: str) -> None:
    """No output inside a run directory; a confidential one neither in nor around a published output."""
    writer = WRITERS[command]
    for folder in _ancestors(path):
        kind = _published(folder)
        if kind == "the run directory":
            raise RunDirError(f"{path}: cannot write {writer.what} inside the run directory {folder}: a run "
                              "directory holds its run's outputs alone; nothing was touched (name a path outside it)")
        if kind is not None and writer.confidential:
            raise RunDirError(f"{path}: cannot write {writer.what} inside {folder} ({kind}): {writer.what} holds "
                              "confidential counts and never goes under a published output; nothing was touched "
                              "(name a path outside it)")
    if writer.confidential and path.is_dir():
        for found in path.rglob("*"):
            if found.name in (MARKER, "manifest.json") and found.parent != path and _published(found.parent):
                raise RunDirError(f"{path}: cannot write {writer.what}: the folder holds {_published(found.parent)} "
                                  f"{found.parent}, and {writer.what} holds confidential counts; nothing was touched "
                                  "(name an absent or empty folder)")


def _is_lock(name: str) -> bool:
    return name == LOCK or name.startswith(f"{LOCK}.")


def bookkeeping(name: str) -> bool:
    """A file of a folder output that is not part of it: its marker or lock."""
    return name == MARKER or _is_lock(name)


def check(path: str | Path, command: str, *, file: bool = False, holding: bool = False
          ) -> tuple[Path, dict[str, str] | None]:
    """The rule, without writing: ``path`` (a folder, or a ``file``) is absent, empty, or an earlier output of
    ``command`` that no other writer holds (``holding``: the caller holds its lock); no output inside a run
    directory, nothing confidential around a published one. Returns the path and the earlier output's marker
    (None: nothing there); raises :class:`RunDirError` otherwise."""
    path, writer = location(path), WRITERS[command]
    _refuse_published(path, command)
    if not path.exists() and not path.is_symlink():
        return path, None
    if not holding:  # another writer's output in the making
        refuse_if_held(_lock_path(path, file), path, _owner(command))
    if file:
        marker = None if path.is_dir() else read_marker(path)
        if marker is None or marker["command"] != command:
            raise RunDirError(f"{path}: cannot write {writer.what}: {'a folder' if path.is_dir() else 'a file'} that "
                              "is not an earlier output of this command is in the way; nothing was touched (name a "
                              "new file)")
        return path, marker
    if not path.is_dir():
        raise RunDirError(f"{path}: cannot write {writer.what}: a file is in the way (name an absent or empty folder)")
    if all(_is_lock(p.name) for p in path.iterdir()):
        return path, None
    marker = read_marker(path)
    if marker is None or marker["command"] != command:
        raise RunDirError(f"{path}: cannot write {writer.what}: the folder holds files that are not an earlier output "
                          "of this command; nothing was touched (name an absent or empty folder)")
    if not writer.replaces:
        raise RunDirError(f"{path}: cannot write {writer.what}: the folder holds an earlier one, which is not "
                          "replaced; nothing was touched (name an absent or empty folder)")
    return path, marker


def _lock_path(path: Path, file: bool) -> Path:
    """The lock file of the output ``path``: ``.lock`` in a folder, ``.<name>.lock`` beside a file."""
    return path.parent / f".{path.name}{LOCK}" if file else path / LOCK


def _owner(command: str) -> str:
    """Who a lock refusal names."""
    return "run" if command in RUN_COMMANDS else f"`topdown {command}`"


@dataclass(frozen=True)
class Claim:
    """A folder held by one command (:func:`claimed`): its marker, and whether it held an earlier output."""

    path: Path
    marker: dict[str, str]
    earlier: bool

    def replace_with(self, new: Path) -> None:
        """Put the complete folder ``new`` in this output's place at once (:func:`rundir.replace_dir`), keeping
        the marker and the lock; refused when the folder holds an entry that ``new`` does not replace (added
        by someone since: nothing but the earlier output is removed)."""
        added = sorted(p.name for p in self.path.iterdir() if not bookkeeping(p.name) and not (new / p.name).exists())
        if added:
            raise RunDirError(f"{self.path}: cannot write {WRITERS[self.marker['command']].what}: the folder holds "
                              f"files that are not an earlier output of this command ({', '.join(added[:3])}"
                              f"{', ...' if len(added) > 3 else ''}); nothing was touched (name an absent or empty "
                              "folder)")
        _write_marker(new, self.marker)
        os.link(self.path / LOCK, new / LOCK)
        replace_dir(new, self.path)


    @contextmanager
    def building(self) -> Iterator[Path | StorePath]:
        """Where to build this output whole: a temporary sibling (``.<name>.partial``) put in this output's place
        at once when the block ends (:meth:`replace_with`), removed if it fails. A store has no rename: the
        output is built in place (the file the command writes last marks it complete), and what the block wrote
        is removed if it fails."""
        if isinstance(self.path, StorePath):
            try:
                yield self.path
            except BaseException:
                for entry in self.path.iterdir():
                    if not bookkeeping(entry.name) and entry.name != "manifest.json":
                        remove_tree(entry) if entry.is_dir() else entry.unlink(missing_ok=True)
                raise
            return
        tmp = self.path.with_name(f".{self.path.name}.partial")
        remove_tree(tmp)
        with removed_on_failure(tmp):  # complete or absent
            yield tmp
            self.replace_with(tmp)


def _write_marker(folder: Path, marker: dict[str, str]) -> None:
    command = marker["command"]
    if command in RUN_COMMANDS:
        RunDir(folder).write_marker(marker)
        return
    write_json_atomic(folder / MARKER, marker)
    if WRITERS[command].confidential:
        private_file(folder / MARKER)


def _only_marker(folder: Path, command: str) -> bool:
    """``folder`` holds nothing but a new marker (and the lock)."""
    name = "manifest.json" if command in RUN_COMMANDS else MARKER
    return all(p.name == name or _is_lock(p.name) for p in folder.iterdir())


@contextmanager
def made_then_removed_on_failure(path: Path) -> Iterator[None]:
    """The folders of ``path`` and above it that the block makes are removed again, deepest first, if it fails
    and they are empty."""
    made = [p for p in (path, *path.parents) if isinstance(p, Path) and not os.path.lexists(p)]
    try:
        yield
    except BaseException:
        for folder in made:  # one that holds anything stays, and those above it
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                break
        raise


def refuse_public(path: StorePath, command: str) -> None:
    """Confidential files (an input, an evaluation, a run's staging) are never written to a bucket anyone can
    read; raises :class:`RunDirError` before anything is written."""
    why = path.public()
    if why is not None:
        what = WRITERS[command].what if WRITERS[command].confidential else "a run's staging (confidential)"
        raise RunDirError(f"{path}: cannot write {what}: {why}; nothing was written (make the bucket private: "
                          "docs/how-to/clusters.md \"Object storage\")")


@contextmanager
def claimed(path: str | Path, command: str) -> Iterator[Claim]:
    """Hold the folder ``path`` for ``command`` while the block writes it: checked by the rule (:func:`check`),
    made (private for a confidential output), locked, checked again under the lock, and marked. A block that
    fails leaves no marker in a folder it found absent or empty, nor a folder it made that stayed empty."""
    path, _ = check(path, command)
    if isinstance(path, StorePath) and (WRITERS[command].confidential or command in RUN_COMMANDS):
        refuse_public(path, command)
    with made_then_removed_on_failure(path):
        if WRITERS[command].confidential:
            with writing(path):
                private_dir(path)
        writable_dir(path, WRITERS[command].what)
        with held(_lock_path(path, False), path, _owner(command)):
            path, earlier = check(path, command, holding=True)  # another writer may have finished meanwhile
            claim = Claim(path, earlier or new_marker(command), earlier is not None)
            if not claim.earlier:
                _write_marker(path, claim.marker)
            try:
                yield claim
            except BaseException:
                if not claim.earlier and path.is_dir() and _only_marker(path, command):
                    (path / ("manifest.json" if command in RUN_COMMANDS else MARKER)).unlink(missing_ok=True)
                raise


@contextmanager
def claimed_file(path: str | Path, command: str) -> Iterator[dict[str, str]]:
    """Hold the file ``path`` for ``command`` while the block writes it (checked by the rule, its folder made,
    locked beside it, checked again); yields the marker the file must carry under :data:`MARKER_KEY`."""
    path, _ = check(path, command, file=True)
    with made_then_removed_on_failure(path.parent):
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
        with held(_lock_path(path, True), path, _owner(command)):
            check(path, command, file=True, holding=True)
            yield file_marker(command)


def writes(command: str) -> Callable[[F], F]:
    """A function whose first argument is the output folder of ``command`` runs holding it (:func:`claimed`)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def holding(out: str | Path, *args: Any, **kwargs: Any) -> Any:
            with claimed(out, command) as claim:
                return fn(claim.path, *args, **kwargs)
        return holding  # type: ignore[return-value]
    return wrap
