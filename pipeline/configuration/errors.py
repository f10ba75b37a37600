"""The errors of bad user files: :class:`ConfigError` (exit 2), a run configuration or a census declaration is
invalid; :class:`InputError` (exit 3), an input file breaks the data contract."""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from topdown.vocab.queries import QueryError


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the key."""


class InputError(ValueError):
    """The input files break the data contract; the message names the file, the column and the value."""


def closest(word: object, choices: Iterable[object]) -> str | None:
    """The choice closest to a misspelt ``word`` (a key, a preset, a census, a level or product name), if any
    is close (difflib's similarity ratio at least 0.6)."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """``"; did you mean 'X'?"`` with the :func:`closest` choice, or ``""``: the end of an error message."""
    close = closest(word, choices)
    return f"; did you mean {close!r}?" if close is not None else ""


def toml_files_beside(path: str | Path) -> list[str]:
    """The ``.toml`` files in the folder of ``path`` (what a misspelt file name may have meant)."""
    folder = Path(path).parent
    return sorted(str(f) for f in folder.glob("*.toml")) if folder.is_dir() else []


def query_hint(exc: QueryError) -> str:
    """:func:`did_you_mean` for a query error's unknown term (``""`` for another query error)."""
    return did_you_mean(exc.term, exc.known) if exc.term is not None else ""
