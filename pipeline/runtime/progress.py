"""Progress of the long commands and their cancellation: one reporter, tqdm bars (on stderr; in a notebook
a widget when ipywidgets is installed, else the same text).

A command reports to the reporter of its context (:func:`reporting`): the command line installs one
(``--quiet``: bars disabled), a :class:`~topdown.pipeline.jobs.Job` installs one with its cancel
event; without one nothing is shown. Every count shown is of tasks, steps, levels, runs or replicates, never
of persons or units (a count of records can be confidential: only declared invariants are public).
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO, TypeVar

with warnings.catch_warnings():  # a notebook without ipywidgets: tqdm.auto warns once and draws text bars
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

T = TypeVar("T")

#: Every bar's text (tests/cli_subprocess.py recognises it): label, share, bar, done/total, elapsed, step.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} {unit} [{elapsed}{postfix}]"


class Cancelled(Exception):
    """The job was cancelled (``Job.cancel``); it stopped at its next step, its run directory resumable."""


class Reporter:
    """The bars of one command (``enabled``: shown) and its cancel event, checked at every step and task."""

    def __init__(self, enabled: bool = True, cancel: threading.Event | None = None, file: TextIO | None = None):
        self.enabled, self.cancel, self.file = enabled, cancel, file
        self._open: dict[Any, tqdm] = {}
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise :class:`Cancelled` once the cancel event is set."""
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled; the run directory can be resumed (resume=True, or topdown run --resume)")

    def bar(self, desc: str, total: int, unit: str) -> tqdm:
        """A new bar of ``total`` ``unit`` (one word: tests/cli_subprocess.py reads the bars), closed by
        :meth:`close` or by the end of :func:`reporting`."""
        bar = tqdm(total=total, desc=desc, unit=unit, bar_format=BAR_FORMAT, disable=not self.enabled,
                   file=self.file, leave=True, mininterval=0.5, dynamic_ncols=True)
        if self.enabled:  # a disabled bar draws nothing and holds nothing: no need to close it
            with self._lock:
                self._open[id(bar)] = bar
        return bar

    def close(self, bar: tqdm) -> None:
        with self._lock:
            self._open.pop(id(bar), None)
        bar.close()

    def close_all(self) -> None:
        """Close every open bar, so that a message printed next starts on a line of its own."""
        with self._lock:
            bars, self._open = list(self._open.values()), {}
        for bar in bars:
            bar.close()

    def tasks(self, product_name: str, level: str, done: int, total: int) -> None:
        """A ``ProgressFn`` (engine.py): ``done`` of ``total`` tasks of ``product_name``'s ``level``."""
        self.check()
        if not self.enabled:
            return
        key = (product_name, level)
        with self._lock:
            bar = self._open.get(key)
        if bar is None:
            bar = self.bar(f"{product_name} {level}", total, "tasks")
            with self._lock:
                self._open[key] = self._open.pop(id(bar))
        bar.update(done - bar.n)
        if done >= total:
            with self._lock:
                self._open.pop(key, None)
            bar.close()


_current: ContextVar[Reporter] = ContextVar("topdown_progress", default=Reporter(enabled=False))


def reporter() -> Reporter:
    """The reporter of this context (a silent one unless :func:`reporting` installed one)."""
    return _current.get()


@contextmanager
def reporting(rep: Reporter) -> Iterator[Reporter]:
    """``rep`` reports for the code run inside; its bars are closed when it ends (also on an error)."""
    token = _current.set(rep)
    try:
        yield rep
    finally:
        rep.close_all()
        _current.reset(token)


@contextmanager
def command_reporting(quiet: bool) -> Iterator[Reporter]:
    """The command line's reporter (``--quiet``: no bars); log lines are written above the bars."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    with reporting(Reporter(enabled=not quiet)) as rep, logging_redirect_tqdm():
        yield rep


class Steps:
    """One bar over the named steps of a command: :meth:`start` begins a step (ending the one before),
    :meth:`close` ends the last one. The current step's name is shown after the counts."""

    def __init__(self, desc: str, total: int) -> None:
        self.rep = reporter()
        self.rep.check()
        self.bar = self.rep.bar(desc, total, "steps")
        self.current: str | None = None

    def start(self, name: str) -> None:
        self.rep.check()
        if self.current is not None:
            self.bar.update(1)
        self.current = name
        self.bar.set_postfix_str(name)

    def close(self) -> None:
        if self.current is not None:
            self.bar.update(1)
            self.current = None
        self.rep.close(self.bar)


def track(items: Iterable[T], desc: str, total: int | None = None, unit: str = "steps") -> Iterator[T]:
    """``items``, counted on a bar of ``total`` (default ``len(items)``) ``unit``, cancellable between items."""
    rep = reporter()
    rep.check()
    bar = rep.bar(desc, total if total is not None else len(items), unit)  # type: ignore[arg-type]
    for item in items:
        yield item
        rep.check()
        bar.update(1)
    rep.close(bar)


def gather(client, futures: Sequence, desc: str, unit: str = "tasks") -> list:
    """The results of Dask ``futures`` (in their order), counted on a bar as they finish."""
    from distributed import as_completed

    for _ in track(as_completed(futures), desc, len(futures), unit):
        pass
    return client.gather(list(futures))


def compute(tasks: Sequence, client, desc: str, unit: str = "tasks") -> list:
    """Compute Dask ``tasks`` (delayed objects) on ``client``, or on local threads without one, counting the
    finished ones on a bar."""
    if client is not None:
        return gather(client, client.compute(list(tasks)), desc, unit)
    import dask
    from dask.callbacks import Callback

    rep = reporter()
    rep.check()
    bar = rep.bar(desc, len(tasks), unit)
    keys = {t.key for t in tasks}

    def finished(key, result, dsk, state, worker_id) -> None:
        if key in keys:
            bar.update(1)

    with Callback(posttask=finished):
        results = list(dask.compute(*tasks, scheduler="threads"))
    rep.close(bar)
    return results


def chain(*fns: Callable[[str, str, int, int], None] | None) -> Callable[[str, str, int, int], None]:
    """One ``ProgressFn`` calling each of ``fns`` (None skipped) in order."""
    live = [f for f in fns if f is not None]

    def progress(product_name: str, level: str, done: int, total: int) -> None:
        for f in live:
            f(product_name, level, done, total)

    return progress
