"""SIGTERM and SIGINT as an exception in the main thread: how every command (cli.py) and a batch (batch.py) stop.

A batch system's kill (SIGTERM) and Ctrl-C (SIGINT) raise :class:`Interrupted`, a ``KeyboardInterrupt``, so that
the code unwinding releases its locks and closes its cluster. Python drops an exception raised inside a
finalizer (a Dask future's ``__del__``) with an "Exception ignored" traceback; a signal that lands there is
delivered again a moment later instead.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

#: The signals :func:`signals_interrupt` turns into :class:`Interrupted`.
STOPPING = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived: the command stops, every lock and cluster is released on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's status of a process stopped by the signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""
        return 128 + self.signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`Interrupted` in the main thread, once: a second one while the code
    unwinds is ignored, so its locks and cluster are still released. A signal that lands inside a finalizer,
    where Python swallows exceptions, is delivered again a moment later. Off the main thread (where Python
    allows no handler) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    delivered: list[int] = []
    active = [True]

    def stop(signum, frame):
        if delivered:
            return
        delivered.append(signum)
        raise Interrupted(signum)

    previous_hook = sys.unraisablehook

    def swallowed(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous_hook(unraisable)
            return
        delivered.clear()  # the interpreter dropped it: send it again, outside the finalizer
        threading.Timer(0.05, again, (unraisable.exc_value.signum,)).start()

    def again(signum: int) -> None:
        if active:
            os.kill(os.getpid(), signum)

    saved = {s: signal.signal(s, stop) for s in STOPPING}
    sys.unraisablehook = swallowed
    try:
        yield
    finally:
        active.clear()
        sys.unraisablehook = previous_hook
        for s, handler in saved.items():
            signal.signal(s, handler)
