"""Solver calls that keep Python's GIL, run in a helper process so that the caller's other threads keep running.

PIQP's Python binding holds the GIL for the whole of a solve; HiGHS (highspy), Clarabel and numpy's BLAS
release it. In a Dask worker a GIL held for minutes stops the worker's event loop, which runs in another
thread of the same process: no heartbeat reaches the scheduler, which after ``distributed.scheduler.worker-ttl``
restarts the worker and runs its task again, and no other worker can fetch data from it meanwhile. So a large
solve is handed to a helper process (:func:`call`): the calling thread waits on a pipe with the GIL
released. The helper runs the same function of the same library on the same arrays, single-threaded, so
its result has the same bits as in process.

Each thread that asks gets one helper, started at its first call (a fresh interpreter: ``sys.executable``)
and kept for the next ones. A helper ignores SIGINT and SIGTERM (its parent stops it); it ends at the end of
its input (its thread's helper was dropped, or the parent process ended) and, on Linux, at once when the
thread that started it ends (``PR_SET_PDEATHSIG``). A call interrupted in the parent ends the helper, and the
next call starts a new one.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import pickle
import signal
import subprocess
import sys
import threading
import weakref
from typing import Any, Callable

#: ``prctl`` option: the signal the kernel sends this process when the thread that started it ends (Linux).
PR_SET_PDEATHSIG = 1


class HelperDied(RuntimeError):
    """The helper process ended during a call: the library crashed (a signal such as SIGSEGV), or the process was
    killed (for example by the kernel when memory ran out). ``how``: "signal 11", "exit status 1", ..."""

    def __init__(self, message: str, how: str = "") -> None:
        super().__init__(message)
        self.how = how


class _Helper:
    """One helper process and its two pipes; ended when the object goes (its thread ended) or at exit."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import serve; serve({os.getpid()})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self.close = weakref.finalize(self, _end, self.proc)

    def call(self, fn: Callable, args: tuple) -> Any:
        request = pickle.dumps((fn, args), protocol=5)  # before any write: a request that does not pickle
        try:
            self.proc.stdin.write(request)
            self.proc.stdin.flush()
            ok, value = pickle.load(self.proc.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            code = self.proc.wait()
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            raise HelperDied(f"the solver's helper process (pid {self.proc.pid}) ended with {how} during "
                             f"{fn.__name__}", how) from None
        if ok:
            return value
        raise value


def _end(proc: subprocess.Popen) -> None:
    """End a helper: the end of its input, then SIGKILL if it is still busy a second later."""
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_local = threading.local()


def call(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` run in this thread's helper process (``fn`` a module-level function, ``args`` picklable);
    its exception is raised here. Raises :class:`HelperDied` when the helper ends during the call."""
    helper = getattr(_local, "helper", None)
    if helper is None or helper.proc.poll() is not None:
        helper = _local.helper = _Helper()
    try:
        return helper.call(fn, args)
    except (HelperDied, KeyboardInterrupt, SystemExit):  # the pipes are out of step: a new helper next time
        helper.close()
        _local.helper = None
        raise


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when the thread that started it ends (Linux; elsewhere the end of its
    input stops it)."""
    name = ctypes.util.find_library("c")
    prctl = getattr(ctypes.CDLL(name), "prctl", None) if name and sys.platform.startswith("linux") else None
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the request above
        os._exit(0)


def serve(parent: int) -> None:
    """The helper's loop: read ``(fn, args)`` from standard input, write ``(True, result)`` or ``(False,
    exception)`` to the original standard output, until the input ends. Anything a library prints goes to
    standard error, never into the replies."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _die_with(parent)
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        try:
            fn, args = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = (True, fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which raises it
            reply = (False, exc)
        try:
            data = pickle.dumps(reply, protocol=5)
        except Exception as exc:  # noqa: BLE001 - an exception that does not pickle: its text
            data = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")), protocol=5)
        replies.write(data)
        replies.flush()
