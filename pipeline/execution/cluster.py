"""Who may join the computation: TLS credentials for the embedded cluster and checked scheduler addresses.

Workers hold true (confidential) histograms, so only processes holding the cluster's credentials may
join it. The embedded ``LocalCluster`` gets Dask's temporary credentials (a fresh self-signed key and
certificate that exist only in this process's memory and its workers'): scheduler, workers and client
authenticate each other over TLS, and any other process is refused. An existing scheduler is reached
at its ``--scheduler`` address; a ``tls://`` address needs the cluster's CA certificate and a client
certificate and key (``--tls-ca-file``, ``--tls-cert``, ``--tls-key``, or the Dask configuration keys
``distributed.comm.tls.ca-file``, ``distributed.comm.tls.client.cert``, ``distributed.comm.tls.client.key``).
"""
from __future__ import annotations

import ast
import logging
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from distributed import Security
from distributed.diagnostics.plugin import WorkerPlugin

from ..configuration.config import ConfigError
from ..runtime.private_files import private_dir, private_file

#: Address schemes that reach a scheduler in another process (distributed also has ``inproc``, which
#: cannot); the TLS ones need credentials.
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
TLS_SCHEMES = ("tls", "wss")
#: Dask configuration key that turns on the embedded cluster's dashboard (``--dashboard``). It is off by default:
#: the dashboard shows task names and progress to any local user who finds its port; on, it listens on
#: 127.0.0.1 only.
DASHBOARD_KEY = "topdown.dashboard"
DASHBOARD_ADDRESS = "127.0.0.1:0"
#: Without the dashboard, the scheduler's and workers' HTTP servers (which Dask starts regardless) serve nothing:
#: no worker list, task log or metrics page either; and the workers do not sample their task's stack every 10 ms
#: for the dashboard's profile page (in the worker's event loop: about 3.5 % of a busy worker's CPU with a
#: 40-frame stack, benchmarks/RESULTS_national.md section 11).
NO_DASHBOARD = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": [],
                "distributed.worker.profile.enabled": False}
#: The CLI flags for the TLS credentials, in the Security fields they set.
TLS_FLAGS = {"tls_ca_file": "--tls-ca-file", "tls_client_cert": "--tls-cert", "tls_client_key": "--tls-key"}


def embedded_security() -> Security:
    """Temporary credentials for an embedded cluster: no process outside this run can join it."""
    return Security.temporary()


class QuietTaskErrors(WorkerPlugin):
    """Drops a worker's "Compute Failed" report (its copy of a task's exception and traceback) in the embedded
    cluster, whose workers print to the user's terminal: the driver reports every failed task itself, a
    documented error as its one-line message, a bug with the traceback (the worker's frames included)."""

    name = "topdown-quiet-task-errors"

    def setup(self, worker) -> None:
        logging.getLogger("distributed.worker").addFilter(_not_compute_failed)


#: Worker log records the embedded cluster drops: a task's error (the driver reports it) and a heartbeat that
#: found the scheduler closing (when a command stops early, its cluster closes while a heartbeat is under way).
_DROPPED = ("Compute Failed", "Failed to communicate with scheduler during heartbeat")


def _not_compute_failed(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_DROPPED)


@contextmanager
def quiet_closing() -> Iterator[Callable[[], None]]:
    """Yields ``quiet``: called when the embedded cluster starts closing, it silences the driver's Dask loggers (its
    scheduler's and connections'), so that a command that stops early (an input error, a signal) prints its one
    line only, not a connection torn down mid-handshake (the scheduler logs those at CRITICAL, with a traceback);
    their level is restored when the block ends."""
    logger = logging.getLogger("distributed")
    level = logger.level
    try:
        yield lambda: logger.setLevel(logging.CRITICAL + 1)
    finally:
        logger.setLevel(level)


@contextmanager
def workers_ignore_stop_signals() -> Iterator[None]:
    """Worker processes started in this block ignore SIGINT and SIGTERM (ignored dispositions survive the spawn):
    Ctrl-C or a batch system's kill reaches the whole process group, and the driver alone stops the command,
    closing the cluster on its way out; a worker killed first would make the scheduler log its loss on the way.
    The nanny still stops a worker (a close message, then SIGKILL), and a worker exits when its nanny dies.
    While the block runs (the cluster's start), the driver ignores them too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _is_main_guard(node: ast.AST) -> bool:
    """``if __name__ == "__main__":`` (either side first)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


def _guarded(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` of the module lies in the body of an ``if __name__ == "__main__":``."""
    return any(_is_main_guard(node) and any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in node.body)
               for node in ast.walk(tree))


def check_main_guarded() -> None:
    """Refuse (:class:`ConfigError`, before anything starts) an embedded cluster started by a script's top-level
    code outside ``if __name__ == "__main__":``. Dask starts the cluster's workers with multiprocessing's
    ``spawn``, which imports the script again in every worker: unguarded, each worker would run the script's
    calls too (start a run, wait for it, find the run directory locked) and never start. A notebook, ``python
    -c`` and an interactive session have no script to import; guarded code and code in imported modules are
    not run again."""
    import dask

    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) is None or dask.config.get(
            "distributed.worker.multiprocessing-method", "spawn") not in ("spawn", "forkserver"):
        return
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:  # the script's top level has finished (a thread it left running)
        return
    script = frame.f_code.co_filename
    try:
        tree = ast.parse(Path(script).read_text(), script)
    except (OSError, SyntaxError, ValueError):
        return
    if not _guarded(tree, frame.f_lineno):
        raise ConfigError(f"{script}, line {frame.f_lineno}: the embedded Dask cluster's worker processes import "
                          f"this script again, so its top-level code would run in each of them: put the script's "
                          f"calls under `if __name__ == \"__main__\":`")


def tls_security(ca_file: str | None = None, cert: str | None = None, key: str | None = None) -> Security | None:
    """Client credentials from the CLI flags (``None`` when none is given); each named file must exist.
    Fields not given come from the Dask configuration."""
    given = {field: value for field, value in zip(TLS_FLAGS, (ca_file, cert, key)) if value is not None}
    if not given:
        return None
    for field, value in given.items():
        if not Path(value).is_file():
            raise ConfigError(f"{TLS_FLAGS[field]} {value}: file not found")
    return Security(require_encryption=True, **given)


def check_scheduler(address: str, security: Security | None = None) -> Security | None:
    """Check a scheduler address and its credentials before anything is written or connected.

    Returns the Security to connect with (for a TLS address without one: the Dask configuration's);
    raises :class:`ConfigError` for an unknown scheme, a TCP or TLS address that is not host:port, a TLS address
    without a CA certificate and client certificate, or TLS credentials given for a plain address.
    """
    scheme, sep, rest = address.partition("://")
    if not sep:  # "host:port": distributed's default protocol
        scheme, rest = "tcp", address
    if not rest:
        raise ConfigError(f"--scheduler {address}: no host:port after the scheme")
    if scheme not in SCHEMES:
        raise ConfigError(f"--scheduler {address}: unknown address scheme {scheme!r} "
                          f"(expected {', '.join(s + '://host:port' for s in SCHEMES[:2])}, or {', '.join(SCHEMES[2:])})")
    if scheme in ("tcp", "tls"):
        from distributed.comm.addressing import parse_host_port

        try:
            parse_host_port(rest)
        except ValueError as exc:
            raise ConfigError(f"--scheduler {address}: not a host:port ({exc})") from None
    if scheme not in TLS_SCHEMES:
        if security is not None and security.require_encryption:
            raise ConfigError(f"--scheduler {address}: TLS credentials were given for a plain {scheme}:// address; "
                              "use the scheduler's tls:// address")
        return security
    security = security if security is not None else Security()
    if not (security.tls_ca_file and security.tls_client_cert):
        raise ConfigError(f"--scheduler {address}: a {scheme}:// scheduler needs the cluster's CA certificate and a "
                          "client certificate: pass --tls-ca-file, --tls-cert and --tls-key (or set "
                          "distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
                          "distributed.comm.tls.client.key in the Dask configuration)")
    return security


def credential_flags(security: Security | None, directory: Path) -> list[str]:
    """The ``--tls-*`` flags that give a child ``topdown`` process the credentials of ``security``
    (a batch's jobs joining its cluster). Temporary credentials live in memory only: they are written
    into ``directory`` (created private, files readable by their owner alone)."""
    if security is None or not security.require_encryption:
        return []
    private_dir(directory)
    flags = []
    for field, flag in TLS_FLAGS.items():
        value = getattr(security, field, None)
        if not value:
            continue
        if "-----BEGIN" in value:  # PEM text (Security.temporary()), not a path
            path = directory / f"{field}.pem"
            private_file(path).write_text(value)
            value = str(path)
        flags += [flag, value]
    return flags
