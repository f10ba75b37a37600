"""Run ``topdown`` as a user does, in a subprocess, and judge how it failed.

The adversarial suites (tests/test_adversarial_*.py) use this instead of calling ``main`` in process: a real
process has its own embedded Dask cluster, whose workers print to the same terminal, its own signal
handling and its own exit code, which is what a user or a scheduler sees.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from topdown.pipeline.privacy.certificate import NOT_PRIVATE_WARNING

#: Lines that are not part of a failure's message: progress bars (execution/progress.py BAR_FORMAT; stderr's
#: lines are split at the bars' carriage returns too) and the test-mode warning.
PROGRESS = re.compile(r"^.+: +\d+%\|.*\| \d+/\d+ \w+ \[\d+:\d+.*\]\s*$")
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
        """stderr's lines that say something: not blank, not progress, not the test-mode warning."""
        return [ln for ln in self.stderr.splitlines()
                if ln.strip() and not PROGRESS.match(ln) and NOT_PRIVATE_WARNING not in ln]

    def tracebacks(self) -> list[str]:
        """stderr lines that belong to a traceback or a Dask worker's failure report."""
        return [ln for ln in self.stderr.splitlines() if any(m in ln for m in _TRACEBACK_MARKERS)]

    def __str__(self) -> str:
        return f"$ topdown {' '.join(self.argv)}\nexit {self.code}\n--- stderr\n{self.stderr}--- stdout\n{self.stdout}"


def topdown(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300,
            preexec_fn=None) -> Outcome:
    """``python -m topdown.pipeline.cli ARGV`` in a subprocess (no standard input), its outcome."""
    args = tuple(str(a) for a in argv)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    done = subprocess.run([sys.executable, "-m", "topdown.pipeline.cli", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          preexec_fn=preexec_fn)
    return Outcome(args, done.returncode, done.stdout, done.stderr)


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
