"""The test harness's fork server (tests/forkserver.py) ends a command as a fresh interpreter ends it: the same exit
status, standard output and standard error, whether the command returns, calls ``sys.exit`` with a number, a
message or nothing, raises, registers ``atexit`` functions or leaves a thread running."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cli_subprocess import _FORKS, _env

PROGRAMS = {
    "returns": "print('out'); import sys; print('err', file=sys.stderr)",
    "exit-3": "import sys; print('partial', end=''); sys.exit(3)",
    "exit-none": "raise SystemExit",
    "exit-300": "raise SystemExit(300)",
    "exit-negative": "raise SystemExit(-1)",
    "exit-message": "import sys; sys.exit('a message')",
    "exit-true": "raise SystemExit(True)",
    "raises": "raise ValueError('boom')",
    "atexit": "import atexit, sys; atexit.register(lambda: print('at exit', flush=False)); sys.exit(4)",
    "atexit-order": ("import atexit; atexit.register(print, 'registered first'); "
                     "atexit.register(print, 'registered second')"),
    "thread": ("import threading, time\n"
               "def late():\n    time.sleep(0.3); print('thread done')\n"
               "threading.Thread(target=late).start()"),
    "unflushed": "import sys; sys.stdout.write('x' * 100_000); sys.stderr.write('tail')",
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_forked_command_ends_as_a_fresh_interpreter(name, tmp_path):
    cmd = [sys.executable, "-c", PROGRAMS[name]]
    fresh = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    forked = _FORKS.run(cmd, tmp_path, _env(), 60)
    assert forked == (fresh.returncode, fresh.stdout, fresh.stderr)
