"""Start a run, a reprocessing, an uncertainty table or replicates without blocking (Jupyter, a script).

:func:`submit` and its siblings return a :class:`Job` at once. The job runs in a background thread of this
process, its tasks on the cluster the call names (``client``, ``scheduler``, or an embedded one of
``workers`` processes, as :func:`~topdown.pipeline.execution.runner.run`). The job shows tqdm bars
(``progress=False``: none), and has ``done()``, ``cancel()``, ``result()`` and ``log``. A cancelled job
stops at its next task or step; its run directory is left as an interrupted run, to continue with
``resume=True``.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .evaluation.replicates import replicates
from .evaluation.uncertainty import uncertainty
from .execution.cluster import check_main_guarded
from .runtime.progress import Cancelled, Reporter, chain, reporting
from .execution.reprocess import reprocess
from .execution.runner import run

log = logging.getLogger("topdown")

_capturing = 0  # jobs whose log is being captured: the topdown logger is at INFO meanwhile
_saved_level = logging.NOTSET
_level_lock = threading.Lock()


class _JobLog(logging.Handler):
    """The ``topdown`` log records of one thread, as lines."""

    def __init__(self, lines: list[str], thread: int) -> None:
        super().__init__(logging.INFO)
        self.lines, self.thread = lines, thread
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.lines.append(self.format(record))


def _capture(handler: _JobLog | None) -> None:
    """Add (``handler``) or remove (None, the last one added by this job) a job's log handler; the topdown
    logger reports INFO while any job captures (records go nowhere else unless a handler was configured)."""
    global _capturing, _saved_level
    with _level_lock:
        if handler is not None:
            if _capturing == 0:
                _saved_level = log.level
                if log.getEffectiveLevel() > logging.INFO:
                    log.setLevel(logging.INFO)
            _capturing += 1
            log.addHandler(handler)
        else:
            _capturing -= 1
            if _capturing == 0:
                log.setLevel(_saved_level)


class Job:
    """One job in a background thread: ``done()``, ``cancel()``, ``result()``, ``status``, ``log``."""

    def __init__(self, name: str, fn: Callable[..., Any], kwargs: dict, progress: bool = True) -> None:
        if kwargs.get("client") is None and not kwargs.get("scheduler"):  # an embedded cluster: refused at once
            check_main_guarded()
        self.name = name
        self.log: list[str] = []  # the job's log lines (topdown logger, this job's thread)
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._reporter = Reporter(enabled=progress, cancel=self._cancel)
        self._thread = threading.Thread(target=self._main, args=(fn, kwargs), name=f"topdown-job-{name}",
                                        daemon=True)
        self._thread.start()

    def _main(self, fn: Callable[..., Any], kwargs: dict) -> None:
        handler = _JobLog(self.log, threading.get_ident())
        _capture(handler)
        try:
            with reporting(self._reporter):
                self._value = fn(**kwargs)
        except BaseException as exc:  # kept for result(); the thread ends quietly
            self._error = exc
            self.log.append(f"{type(exc).__name__}: {exc}")
        finally:
            log.removeHandler(handler)
            _capture(None)
            self._finished.set()

    def done(self) -> bool:
        """True once the job finished: complete, failed or cancelled."""
        return self._finished.is_set()

    def cancel(self) -> bool:
        """Ask the job to stop at its next task or step; False if it had already finished."""
        self._cancel.set()
        return not self.done()

    def cancelled(self) -> bool:
        return self.done() and isinstance(self._error, Cancelled)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the job to finish (at most ``timeout`` seconds); True if it did."""
        return self._finished.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """What the call returned (a run's directory, as :func:`run` returns it), once finished; the job's
        error is raised again (:class:`Cancelled` for a cancelled job)."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The job's error (None when it succeeded), once finished."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"job {self.name} still running after {timeout} s")
        return self._error

    @property
    def status(self) -> str:
        """running, cancelling, complete, cancelled or failed."""
        if not self.done():
            return "cancelling" if self._cancel.is_set() else "running"
        if self._error is None:
            return "complete"
        return "cancelled" if isinstance(self._error, Cancelled) else "failed"

    def __repr__(self) -> str:
        return f"<Job {self.name}: {self.status}>"


def submit(config, out: str | Path | None = None, *, progress: bool = True,
           on_progress: Callable[[str, str, int, int], None] | None = None, **kwargs) -> Job:
    """Start :func:`~topdown.pipeline.execution.runner.run` (same arguments: client, scheduler, workers,
    input_dir, resume, force...) and return its :class:`Job` at once; ``job.result()`` is the run directory.
    ``on_progress``: also called as ``(product, level, done, total)`` when a level's task finishes."""
    name = Path(out).name if out is not None else str(getattr(getattr(config, "run", None), "name", config))
    return Job(name, run, dict(config=config, out=out, progress=chain(on_progress), **kwargs), progress)


def submit_reprocess(source: str | Path, out: str | Path, changes: str | Path | None = None, *, progress: bool = True,
                     on_progress: Callable[[str, str, int, int], None] | None = None, **kwargs) -> Job:
    """Start :func:`~topdown.pipeline.execution.reprocess.reprocess` (same arguments); ``result()`` is the new
    run directory."""
    return Job(Path(out).name, reprocess, dict(source=source, out=out, changes=changes, progress=chain(on_progress),
                                               **kwargs), progress)


def submit_uncertainty(run: str | Path, out: str | Path, *, progress: bool = True, **kwargs) -> Job:
    """Start :func:`~topdown.pipeline.evaluation.uncertainty.uncertainty` (same arguments); ``result()`` is
    its cost record."""
    return Job(Path(out).name, uncertainty, dict(run=run, out=out, **kwargs), progress)


def submit_replicates(run: str | Path, n: int, out: str | Path, *, progress: bool = True, **kwargs) -> Job:
    """Start :func:`~topdown.pipeline.evaluation.replicates.replicates` (same arguments); ``result()`` is the
    replicates record."""
    return Job(Path(out).name, replicates, dict(run=run, n=n, out=out, **kwargs), progress)
