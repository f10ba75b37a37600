"""Run ``topdown`` as a user does, in a subprocess, and judge how it failed.

The adversarial suites (tests/test_adversarial_*.py) use this instead of calling ``main`` in process: a real
process has its own embedded Dask cluster, whose workers print to the same terminal, its own signal
handling and its own exit code, which is what a user or a scheduler sees.
"""
from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from topdown.pipeline.privacy.certificate import NOT_PRIVATE_WARNING, waived_warning

#: Lines that are not part of a failure's message: progress bars (runtime/progress.py BAR_FORMAT; stderr's
#: lines are split at the bars' carriage returns too), INFO log lines, the test-mode and the waiver warnings.
PROGRESS = re.compile(r"^.+: +\d+%\|.*\| \d+/\d+ \w+ \[\d+:\d+.*\]\s*$")
_WAIVED = waived_warning([]).split("[]", 1)[1]
_LOG = re.compile(r"^\d{2}:\d{2}:\d{2} (DEBUG|INFO) ")  # the CLI's log lines below WARNING (a run's progress)
_TRACEBACK_MARKERS = ("Traceback (most recent call last)", 'File "', "Compute Failed", "distributed.worker")


@dataclass(frozen=True)
class Outcome:
    """What one ``topdown`` process did."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stderr + self.stdout

    def message_lines(self) -> list[str]:
        """stderr's lines that say something: not blank, not progress or INFO, not the test-mode or waiver warning."""
        return [ln for ln in self.stderr.splitlines()
                if ln.strip() and not PROGRESS.match(ln) and not _LOG.match(ln) and NOT_PRIVATE_WARNING not in ln
                and _WAIVED not in ln]

    def tracebacks(self) -> list[str]:
        """stderr lines that belong to a traceback or a Dask worker's failure report."""
        return [ln for ln in self.stderr.splitlines() if any(m in ln for m in _TRACEBACK_MARKERS)]

    def __str__(self) -> str:
        return f"$ topdown {' '.join(self.argv)}\nexit {self.code}\n--- stderr\n{self.stderr}--- stdout\n{self.stdout}"


def topdown(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300,
            preexec_fn=None) -> Outcome:
    """``python -m topdown.pipeline.cli ARGV`` in a process of its own (no standard input), its outcome."""
    args = tuple(str(a) for a in argv)
    code, stdout, stderr = _FORKS.run([sys.executable, "-m", "topdown.pipeline.cli", *args], cwd, _env(env), timeout,
                                      fresh=preexec_fn is not None or _needs_fresh_interpreter(env), preexec_fn=preexec_fn)
    outcome = Outcome(args, code, stdout, stderr)
    _tally(outcome)
    return outcome


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A command's environment: this process's, unbuffered, with ``extra``."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


#: An unreachable scheduler is reported after this wait (Dask's connect timeout, 30 s by default), not Dask's.
SHORT_CONNECT = (("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "3s"),)


def _needs_fresh_interpreter(env: dict[str, str] | None) -> bool:
    """An environment that could change what an interpreter imports or how, or the Dask configuration it reads at
    import: run it in a fresh interpreter."""
    return any((k.startswith("PYTHON") and k != "PYTHONUNBUFFERED") or k.startswith("DASK_") for k in env or ())


def _text(data: bytes) -> str:
    """Bytes as ``subprocess.run(text=True)`` reads them (the locale's encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


class ForkServer:
    """Runs each command in a child forked from one process that has imported the package once
    (tests/forkserver.py); a fresh interpreter instead when asked to, when the server is busy with another
    thread's command, or when ``TOPDOWN_TEST_FRESH=1`` (every command in a new interpreter, as a user starts it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._to = self._from = None

    def _start(self) -> None:
        server_in, client_out = os.pipe()
        client_in, server_out = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("forkserver.py")), str(server_in), str(server_out)],
            pass_fds=(server_in, server_out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=_env(), cwd=Path(__file__).parent)
        os.close(server_in)
        os.close(server_out)
        self._to = os.fdopen(client_out, "w")
        self._from = os.fdopen(client_in, "rb", buffering=0)

    def _reply(self, deadline: float | None) -> dict | None:
        """The server's next line, or None when ``deadline`` (seconds) passes first."""
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self._from], [], [], deadline)
            if not ready:
                return None
            chunk = self._from.read(1)
            if not chunk:
                raise ConnectionError("the fork server ended")
            line += chunk
        return json.loads(line)

    def run(self, cmd: list[str], cwd, env: dict[str, str], timeout: float, fresh: bool = False,
            preexec_fn=None) -> tuple[int, str, str]:
        """``cmd`` (``python -m MODULE ARGS`` or ``python -c CODE ARGS``): its exit code, stdout and stderr."""
        if fresh or os.environ.get("TOPDOWN_TEST_FRESH") == "1" or not self._lock.acquire(blocking=False):
            done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)
            return done.returncode, done.stdout, done.stderr
        try:
            return self._forked(cmd, cwd, env, timeout)
        finally:
            self._lock.release()

    def _forked(self, cmd, cwd, env, timeout) -> tuple[int, str, str]:
        kind, argv = ("cli", cmd[3:]) if cmd[1] == "-m" else ("api", cmd[2:])
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        with tempfile.TemporaryDirectory(prefix="topdown-fork-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            self._to.write(json.dumps({"kind": kind, "argv": argv, "cwd": str(cwd or os.getcwd()),
                                       "env": env, "stdout": str(out), "stderr": str(err)}) + "\n")
            self._to.flush()
            pid = self._reply(60)["pid"]
            reply = self._reply(timeout)
            if reply is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_bytes(), err.read_bytes())
            return reply["status"], _text(out.read_bytes()), _text(err.read_bytes())


_FORKS = ForkServer()


def _tally(outcome: Outcome) -> None:
    """With ``TOPDOWN_TEST_TALLY=FILE``, one JSON line per command into FILE (the test, the command, its exit code
    and how many traceback lines it printed): the suites' cases by outcome, for a report."""
    path = os.environ.get("TOPDOWN_TEST_TALLY")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                                 "command": outcome.argv[0] if outcome.argv else "", "code": outcome.code,
                                 "traceback_lines": len(outcome.tracebacks())}) + "\n")


def assert_clean_failure(outcome: Outcome, code: int, *fragments: str) -> None:
    """The documented exit code, no traceback (worker-side ones included), and exactly one message line on
    stderr (``topdown: ...``) holding every fragment."""
    assert outcome.code == code, str(outcome)
    assert outcome.tracebacks() == [], str(outcome)
    lines = outcome.message_lines()
    assert len(lines) == 1 and lines[0].startswith("topdown: "), f"not a one-line message:\n{outcome}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in the message:\n{outcome}"


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or the file itself) with its bytes: {} when absent."""
    path = Path(path)
    if path.is_file():
        return {"": path.read_bytes()}
    if not path.is_dir():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


#: Runs Python API code (argv[1]) and maps its exception to the command line's exit code and one line, as
#: ``topdown`` does (an unforeseen exception: exit 6 with its traceback); Python warnings are not shown.
_API_DRIVER = """import argparse, sys, warnings
from topdown.pipeline.cli import _failed
warnings.simplefilter("ignore")  # the API's warnings (test-mode noise) are Python warnings, not messages
try:
    exec(compile(sys.argv[1], "<api>", "exec"), {"__name__": "__api__"})
except Exception as exc:
    sys.exit(_failed(exc, argparse.Namespace()))
"""


def api(code: str, cwd: Path | None = None, timeout: float = 300) -> Outcome:
    """The Python API ``code`` run in a process of its own (no standard input), its outcome judged as a command's."""
    returncode, stdout, stderr = _FORKS.run([sys.executable, "-c", _API_DRIVER, code], cwd, _env(), timeout)
    outcome = Outcome(("api", code), returncode, stdout, stderr)
    _tally(outcome)
    return outcome
