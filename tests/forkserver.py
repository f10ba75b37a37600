"""A process that imports ``topdown``'s command line and its heavy dependencies once, then forks one child per
command (cli_subprocess.py starts it and sends it the commands).

Each child is a process of its own, set up as ``python -m topdown.pipeline.cli ARGV`` or ``python -c DRIVER CODE``
would be: its own pid, working directory, environment, standard input (``/dev/null``) and output files, its
command run as ``__main__`` (so the embedded cluster's spawned workers import it the same way) and its exit
code from the interpreter's own handling of ``SystemExit`` and uncaught exceptions. What it saves is the
second or so each new interpreter spends importing pandas, pyarrow, scipy, pydantic and Dask.

Protocol, one JSON object a line: the client sends ``{"kind": "cli"|"api", "argv": [...], "cwd": ..., "env":
{...}, "stdout": PATH, "stderr": PATH}``; the server answers ``{"pid": N}`` once the child is forked and
``{"status": S}`` (the child's return code as ``subprocess`` gives it: ``-N`` for signal N) when it ends.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import types

#: Imported once, before any fork, with every module of the package (:func:`package_modules`).
PRELOAD = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "pyarrow.dataset", "scipy.sparse", "scipy.stats",
           "pydantic", "dask", "dask.dataframe", "distributed", "tqdm", "fsspec")


def package_modules() -> list[str]:
    """Every module of ``topdown`` but the command line (which ``runpy`` runs afresh as ``__main__``)."""
    import pkgutil

    names = []
    for sub in ("pipeline", "geo", "solvers", "vocab"):
        package = importlib.import_module(f"topdown.{sub}")
        names += [m.name for m in pkgutil.walk_packages(package.__path__, f"topdown.{sub}.")]
    return [n for n in names if n != "topdown.pipeline.cli"]


def preload() -> None:
    """Import :data:`PRELOAD` and the package's modules, then freeze the heap, so a child's garbage collection
    does not copy every page it inherited."""
    import gc

    for name in (*PRELOAD, *package_modules()):
        try:
            importlib.import_module(name)
        except Exception:  # a module this environment lacks is imported (or refused) by the child as usual
            pass
    sys.modules.pop("topdown.pipeline.cli", None)
    gc.freeze()


def _become(request: dict) -> None:
    """In the child: the standard streams, directory and environment of a new process."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    # sys.path[0] as the interpreter sets it: the working directory for ``-m``, "" (the current one) for ``-c``
    sys.path[0] = request["cwd"] if request["kind"] == "cli" else ""
    os.environ.clear()
    os.environ.update(request["env"])
    import dask.config

    dask.config.refresh()  # Dask read its DASK_* settings from the server's environment when it was imported


def serve(channel_in, channel_out) -> dict | None:
    """Fork a child per request; return the request in the child (None in the server once its input ends)."""
    for line in channel_in:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            channel_in.close()
            channel_out.close()
            _become(request)
            return request
        channel_out.write(json.dumps({"pid": pid}) + "\n")
        channel_out.flush()
        _, status = os.waitpid(pid, 0)
        channel_out.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        channel_out.flush()
    return None


def run(request: dict) -> None:
    """The child's command, at the top level: exceptions and ``SystemExit`` end the process as they would
    end ``python -m ...`` or ``python -c ...``; a command that ends normally or by ``SystemExit`` ends through
    :func:`finish`."""
    try:
        _command(request)
    except SystemExit as stop:
        finish(stop)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # printed as the interpreter prints it, without this file's frames
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        finish(SystemExit(1))
    else:
        finish(SystemExit(0))


def exit_status(stop: SystemExit) -> int | None:
    """The status the interpreter exits with on ``stop`` (None: a message it prints, then status 1)."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) and not isinstance(stop.code, bool) else None


def finish(stop: SystemExit) -> None:
    """End the child as the interpreter ends a process (wait for its non-daemon threads, run the ``atexit``
    functions, flush the standard streams), then ``os._exit`` without tearing down the ~1,600 modules the
    server imported (0.2 s a command). Anything unusual (a message to print, a stream that cannot be flushed)
    is left to the interpreter's own exit."""
    import atexit
    import threading

    status = exit_status(stop)
    if status is None:
        raise stop
    threading._shutdown()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        raise stop from None
    os._exit(status & 0xFF)


def _command(request: dict) -> None:
    if request["kind"] == "cli":
        import runpy

        sys.argv = ["topdown.pipeline.cli", *request["argv"]]
        runpy.run_module("topdown.pipeline.cli", run_name="__main__", alter_sys=True)
    else:
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        sys.argv = ["-c", *request["argv"][1:]]
        exec(compile(request["argv"][0], "<string>", "exec"), main.__dict__)


if __name__ == "__main__":
    # The protocol runs over two descriptors of its own (argv), so a child's 0, 1 and 2 are plain files.
    preload()
    found = serve(os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w"))
    if found is not None:
        run(found)
