"""The ``topdown`` command line.

Exit codes (for scheduled use): 0 success; 1 verification failed; 2 bad configuration or usage
(including an unreachable --scheduler, one with an unknown
scheme, or tls:// without credentials); 3 bad input data (one of the declared errors of
:func:`input_errors`, or a missing input file); 4 run directory unusable (locked, not
writable, already complete without --force, a second production draw without --redraw, a staged
chunk that fails its SHA-256 check in production, a write refused by a full disk or a read-only place, an
--out holding files that are not an earlier output of the command, an output inside a run directory or a
confidential one inside a published output (runtime/outdir.py), a source run's file that fails its recorded
SHA-256); 5 estimation failed; 6 internal error (any other exception, a plain ValueError included, with its
traceback); 130 interrupted by SIGINT, 143 by SIGTERM; 141 (quietly) when the reader of standard output closed it
(``topdown ... | head``).
"""
from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .execution.signals import signals_interrupt
from .inputs import RACE_CHOICES

EXIT_OK, EXIT_VERIFY, EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR, EXIT_ESTIMATION, EXIT_INTERNAL, EXIT_INTERRUPTED = (
    0, 1, 2, 3, 4, 5, 6, 130)
#: Exit status of a command stopped by SIGTERM (SIGINT: :data:`EXIT_INTERRUPTED`), 128 + the signal's number.
EXIT_TERMINATED = 143
#: Exit status of a command whose standard output was closed by its reader (``topdown ... | head``): 128 + SIGPIPE,
#: as the shell reports a Unix tool that SIGPIPE stopped.
EXIT_CLOSED_PIPE = 141

log = logging.getLogger("topdown")


def _security(args: argparse.Namespace):
    """The TLS client credentials of the --tls-* flags (None without them)."""
    if not hasattr(args, "tls_ca_file"):  # a command without a cluster
        return None
    from .execution.cluster import tls_security
    from .configuration.config import ConfigError

    security = tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    if security is not None and not args.scheduler:
        raise ConfigError("--tls-ca-file/--tls-cert/--tls-key are for a --scheduler tls:// address; the embedded "
                          "cluster makes its own temporary credentials")
    return security


def cmd_run(args: argparse.Namespace) -> int:
    from .execution.runner import configure_run, run

    config = configure_run(args.config, args.input, args.seed)
    security = _security(args)
    start = time.perf_counter()
    with _privacy_warnings_as_lines():
        out = run(config, args.out, client=None, scheduler=args.scheduler, workers=args.workers, resume=args.resume,
                  force=args.force, security=security, redraw=args.redraw)
    _print_summary("run", out, start)
    return EXIT_OK


@contextmanager
def _privacy_warnings_as_lines() -> Iterator[None]:
    """A run's :class:`~topdown.pipeline.privacy.certificate.NotPrivateWarning` printed as one line on stderr,
    ``topdown: WARNING: ...`` (Python shows a warning with its source file and line)."""
    import warnings

    from .privacy.certificate import NotPrivateWarning

    show = warnings.showwarning

    def shown(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, NotPrivateWarning):
            print(f"topdown: WARNING: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = shown
    try:
        yield
    finally:
        warnings.showwarning = show


def cmd_reprocess(args: argparse.Namespace) -> int:
    from .execution.reprocess import reprocess

    start = time.perf_counter()
    out = reprocess(args.run, args.out, args.config, spine=args.spine, scheduler=args.scheduler, workers=args.workers,
                    resume=args.resume, force=args.force, security=_security(args))
    _print_summary("reprocessing (no privacy loss added)", out, start)
    return EXIT_OK


def cmd_batch(args: argparse.Namespace) -> int:
    from .execution.batch import Batch, render

    batch = Batch(Path(args.jobs), summary=Path(args.summary) if args.summary else None)
    code = batch.run(wait=args.wait)
    print(render(batch.summary))
    print(f"summary written to {batch.summary_path}", file=sys.stderr)
    return code


def _print_summary(what: str, out: Path, start: float) -> None:
    from .runtime.rundir import RunReader

    manifest = RunReader(out).manifest()
    print(f"{what} complete in {time.perf_counter() - start:.1f}s: {out}")
    for product, levels in manifest.parents_solved.items():
        print(f"  {product}: " + ", ".join(f"{lv} {v['solved']} solved/{v['parents']} parents" for lv, v in levels.items()))
    if manifest.failsafe:
        print(f"  failsafe used for {len(manifest.failsafe)} parent(s); see manifest.json")


def cmd_verify(args: argparse.Namespace) -> int:
    from .outputs.verify import verify_run

    report = verify_run(args.run)
    for note in report.notes:
        print(f"  note: {note}")
    if report.ok:
        print(f"verify: OK ({report.checks} checks) {args.run}")
        return EXIT_OK
    print(f"verify: {len(report.failures)} of {report.checks} checks FAILED in {args.run}")
    for failure in report.failures:
        print(f"  - {failure}")
    return EXIT_VERIFY


def cmd_privacy(args: argparse.Namespace) -> int:
    from .privacy.certificate import certificate, render_certificate, write_certificate
    from .configuration.config import load_config

    config = load_config(args.config)
    cert = certificate(config)
    if args.out:  # refused (exit 4) before anything is printed
        write_certificate(Path(args.out), cert)
    print(json.dumps(cert, indent=2) if args.json else render_certificate(cert))
    if args.out:
        print(f"certificate written to {args.out}", file=sys.stderr)
    return EXIT_OK


def cmd_demo_data(args: argparse.Namespace) -> int:
    from .inputs.demo_data import write_demo_input

    write_demo_input(args.out)
    print(f"demo input written to {args.out}/persons.parquet and {args.out}/units.parquet")
    return EXIT_OK


def cmd_synth(args: argparse.Namespace) -> int:
    from .configuration.config import ConfigError
    from .inputs.us_synth import write_partitioned, write_synthetic

    if args.census is not None:
        return _synth_census(args)
    if args.shape is not None:
        return _synth_shape(args)
    if args.scale is not None:
        raise ConfigError("--scale goes with --shape us2020")
    if args.blocks is None:
        raise ConfigError("synth needs --blocks N (P.L. 94-171 shaped input), --shape us2020, or --census NAME "
                          "--persons N")
    if args.states is None and args.persons is None:
        write_synthetic(Path(args.out), blocks=args.blocks, seed=args.seed)
        print(f"synthetic input ({args.blocks} blocks, seed {args.seed}) written to {args.out}")
        return EXIT_OK
    persons, units = write_partitioned(Path(args.out), blocks=args.blocks, seed=args.seed, persons=args.persons,
                                       states=1 if args.states is None else args.states)
    print(f"synthetic input ({args.blocks} blocks in {args.states or 1} state(s), {persons} persons, {units} units, "
          f"seed {args.seed}) written to {args.out}/persons/ and {args.out}/units/ (hive-partitioned by state)")
    return EXIT_OK


def _synth_shape(args: argparse.Namespace) -> int:
    """``synth --shape us2020 [--scale S]``: the 52 state-equivalents of 2020, hive-partitioned by state."""
    from .configuration.config import ConfigError
    from .inputs.us_synth import write_us2020

    if args.blocks is not None or args.states is not None or args.persons is not None:
        raise ConfigError(f"--shape {args.shape} takes --scale S, not --blocks, --states or --persons (the shape "
                          "fixes them)")
    n = write_us2020(Path(args.out), seed=args.seed, scale=1.0 if args.scale is None else args.scale)
    print(f"synthetic input of shape {args.shape} (scale {args.scale or 1}, seed {args.seed}): {n['blocks']} blocks, "
          f"{n['persons']} persons, {n['units']} units in 52 states, written to {args.out}/persons/, {args.out}/units/ "
          f"(hive-partitioned by state) and {args.out}/baf/ (block assignment files)")
    return EXIT_OK


def _synth_census(args: argparse.Namespace) -> int:
    """``synth --census NAME --persons N``: an input of a declared census's shape."""
    from .configuration.config import ConfigError

    if args.blocks is not None or args.states is not None:
        raise ConfigError("--census takes --persons N, not --blocks or --states (those shape P.L. 94-171 input)")
    if args.shape is not None or args.scale is not None:
        raise ConfigError("--census takes --persons N, not --shape or --scale")
    if args.persons is None:
        raise ConfigError(f"--census {args.census} needs --persons N (about how many persons to write)")
    from .configuration.census import load_census
    from .inputs.synth import synth_hints, write_census
    from .inputs.synth_households import asks_for_households, write_households

    census = load_census(args.census, "--census")
    write = write_households if asks_for_households(synth_hints(census)) else write_census
    written = write(Path(args.out), census, persons=args.persons, seed=args.seed)
    files = ", ".join(f"{n} {kind} records in {args.out}/{kind}/" for kind, n in written.items())
    print(f"synthetic input of census {census.name} (seed {args.seed}): {files}")
    return EXIT_OK


def cmd_ingest(args: argparse.Namespace) -> int:
    from .inputs.ingest import ingest_blocks, ingest_pl94

    from .configuration.config import ConfigError

    if args.format == "pl94":
        if args.races is not None:
            raise ConfigError("--races is for `ingest blocks`: P.L. 94-171 tables give every block's race detail")
        summary = ingest_pl94(Path(args.source), Path(args.out))
    else:
        summary = ingest_blocks(Path(args.source), Path(args.out), races=args.races or "spread")
    print("\n".join(summary.lines()))
    print(f"input written to {args.out}/persons.parquet and {args.out}/units.parquet")
    return EXIT_OK


def cmd_spine(args: argparse.Namespace) -> int:
    from topdown.geo.report import spine_command

    from .configuration.config import ConfigError
    from .runtime.outdir import claimed

    if not Path(args.baf).is_dir():
        raise ConfigError(f"--baf {args.baf}: no such directory (a directory of BlockAssign_*.txt[.gz] files)")

    with claimed(args.out, "spine"):
        report = spine_command(Path(args.baf), Path(args.units) if args.units else None, Path(args.out))
    print((Path(args.out) / "report.txt").read_text() if (Path(args.out) / "report.txt").exists() else json.dumps(report, indent=2))
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluation.evaluate import evaluate_command

    return evaluate_command(args.runs, args.truth, entities=args.entities, out=args.out, scheduler=args.scheduler, workers=args.workers,
                            uncertainty=args.uncertainty, suppress=not args.no_suppress, audit=args.audit)


def cmd_nmf(args: argparse.Namespace) -> int:
    from .execution.nmf import write_nmf

    out = write_nmf(args.run, args.out)
    print(f"noisy measurement file written to {out} (layout: pipeline/execution/nmf.py, docs/how-to/uncertainty.md)")
    return EXIT_OK


def cmd_uncertainty(args: argparse.Namespace) -> int:
    from .evaluation.uncertainty import uncertainty

    cost = uncertainty(args.run, args.out, entities=Path(args.entities) if args.entities else None, levels=args.levels,
                       scheduler=args.scheduler, workers=args.workers, replicates=args.replicates, spine=args.spine,
                       config=args.config, calibrate=args.calibrate)
    print(f"uncertainty of {args.run} written to {args.out}: {cost.rows} rows; {cost.wall_seconds:.1f}s wall, "
          f"{cost.worker_cpu_seconds:.1f}s worker CPU in {cost.tasks} tasks, {cost.client_cpu_seconds:.1f}s client CPU")
    return EXIT_OK


def cmd_replicates(args: argparse.Namespace) -> int:
    from .evaluation.replicates import replicates

    record = replicates(args.run, args.n, args.out, scheduler=args.scheduler, workers=args.workers,
                        parallel=args.parallel)
    wall = sum(r["wall_seconds"] for r in record["replicates"])
    print(f"{len(record['replicates'])} replicate(s) of {args.run} in {args.out} ({wall:.1f}s of runs); "
          "they read published data only and spend no privacy budget")
    return EXIT_OK


def cmd_audit(args: argparse.Namespace) -> int:
    from .evaluation.audit import AuditError, audit_command
    from topdown.vocab.queries import QueryError

    try:
        return audit_command(args.config, args.input, args.move, args.runs, args.out, args.queries, args.seed,
                             args.scheduler, args.workers)
    except (AuditError, QueryError) as exc:
        print(f"topdown: audit: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """The arguments that choose the Dask cluster: an embedded one of --workers processes, or --scheduler
    (with the --tls-* files for a tls:// address)."""
    p.add_argument("--workers", type=int, help="worker processes of the embedded cluster (default: CPU count)")
    p.add_argument("--scheduler", help="address of an existing Dask scheduler, e.g. tcp://127.0.0.1:8786 or "
                                       "tls://10.0.0.5:8786 (with the --tls-* files)")
    p.add_argument("--tls-ca-file", help="PEM file of the CA that signed the TLS cluster's certificates")
    p.add_argument("--tls-cert", help="PEM client certificate for a tls:// scheduler (may hold the key too)")
    p.add_argument("--tls-key", help="PEM private key of the client certificate")
    p.add_argument("--dashboard", action="store_true", help="serve the embedded cluster's Dask dashboard on "
                                                            "127.0.0.1 (off by default; its address goes to stderr)")
    _quiet_arg(p)


def _quiet_arg(p: argparse.ArgumentParser) -> None:
    """--quiet: no progress bars (a long command shows them on stderr; runtime/progress.py)."""
    p.add_argument("--quiet", action="store_true", help="no progress output")


#: The path arguments that name what a command writes (outdir.py's rules apply to them); the others are read.
OUTPUT_ARGUMENTS = ("out", "summary")
#: The arguments that name files or folders (checked against the file system's name limits before a command runs,
#: and those read for their kind: a regular file or a folder).
PATH_ARGUMENTS = ("config", "census", "out", "input", "run", "runs", "truth", "entities", "audit", "uncertainty",
                  "source", "baf", "units", "spine", "replicates", "calibrate", "jobs", "summary", "tls_ca_file",
                  "tls_cert", "tls_key")
#: The path arguments that take an object store's URL (``s3://``, ``gs://``, ``abfs://``;
#: docs/how-to/clusters.md "Object storage"), by command; any other path argument is local (a URL there is refused, exit 2).
STORE_ARGUMENTS = {"run": ("out", "input"), "verify": ("run",), "demo-data": ("out",), "reprocess": ("run", "out"),
                   "nmf": ("run", "out"), "uncertainty": ("run", "out", "replicates", "calibrate"),
                   "replicates": ("run", "out"), "evaluate": ("runs", "truth", "out", "uncertainty")}


def _check_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every path argument named (an empty one is not the current directory) and within the file system's name
    limits, every one read a regular file or a folder (or a storage URL where the command takes one), every seed
    and ``--wait`` within its range (configuration/limits.py) and ``--workers`` a positive number within the
    machine's (preflight.py), refused by name (exit 2) before the command starts."""
    from .configuration.config import ConfigError
    from .configuration.limits import MAX_WAIT, check_file_kind, check_path, check_seconds, check_seed
    from .runtime.storage import is_url, location

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    for action in sub._actions:
        value = getattr(args, action.dest, None)
        name = action.option_strings[-1] if action.option_strings else action.dest.upper()
        if action.dest == "seed":
            check_seed(value, name)
        elif action.dest == "wait":
            check_seconds(value, name, MAX_WAIT)
        elif action.dest == "workers" and value is not None:
            from .execution.preflight import check_workers

            check_workers(value)
        elif action.dest in PATH_ARGUMENTS:
            for item in value if isinstance(value, list) else [value]:
                if item == "":
                    verb = "write" if action.dest in OUTPUT_ARGUMENTS else "read"
                    raise ConfigError(f"{name} is empty: name the file or folder to {verb}")
                if isinstance(item, str):
                    check_path(item, name)
                    if action.dest not in OUTPUT_ARGUMENTS and not is_url(item):
                        check_file_kind(item, name)
                if is_url(item):
                    if action.dest not in STORE_ARGUMENTS.get(args.command, ()):
                        raise ConfigError(f"{name} {item}: `topdown {args.command}` takes a local path there, not a "
                                          f"storage URL (taken by `topdown {' / '.join(STORE_ARGUMENTS)}`; "
                                          'docs/how-to/clusters.md "Object storage")')
                    location(item)  # an unknown scheme or a missing extra: refused here


@contextmanager
def _command_setup(args: argparse.Namespace) -> Iterator[None]:
    """What every command runs under: for the commands with a cluster, ``--dashboard`` and the --tls-* flags as
    Dask configuration."""
    if not hasattr(args, "dashboard"):  # no cluster: neither Dask nor its configuration is needed
        yield
        return
    import dask

    from .execution.cluster import DASHBOARD_KEY

    with dask.config.set({DASHBOARD_KEY: bool(args.dashboard)}), _tls_config(args):
        yield


@contextmanager
def _tls_config(args: argparse.Namespace) -> Iterator[None]:
    """The --tls-* flags as Dask's TLS configuration while a command runs, so that every command that
    connects to a --scheduler (evaluate, uncertainty, replicates...) uses them."""
    if _security(args) is None:
        yield
        return
    import dask

    with dask.config.set({"distributed.comm.tls.ca-file": args.tls_ca_file,
                          "distributed.comm.tls.client.cert": args.tls_cert,
                          "distributed.comm.tls.client.key": args.tls_key}):
        yield


#: Every command's help ends with these (docs/reference/exit-codes.md).
EXIT_CODES_HELP = ("exit codes: 0 success; 1 verify found a failed check; 2 configuration or usage error; 3 input "
                   "error; 4 run directory unusable; 5 estimation failed; 6 internal error (a bug: please report "
                   "it); 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM; 141 standard output closed by its "
                   "reader (piped into head)")

#: One example a command's help shows (every one runs on the bundled data, from a clone's root).
EXAMPLES = {
    "run": "topdown run demo --out runs/demo --workers 2",
    "reprocess": "topdown reprocess runs/demo --out runs/demo-again --config my-rounder.toml",
    "batch": "topdown batch jobs.toml --wait 600",
    "verify": "topdown verify runs/demo",
    "privacy": "topdown privacy pl94_production_2021 --json --out production.certificate.json",
    "demo-data": "topdown demo-data demo-input",
    "synth": "topdown synth --blocks 15000 --seed 1 synth",
    "ingest": "topdown ingest blocks data/ri2010/ri_2010_block_demographics.csv.gz --out ri2010-input",
    "evaluate": "topdown evaluate runs/demo --truth demo-input",
    "nmf": "topdown nmf runs/demo --out runs/demo-nmf",
    "uncertainty": "topdown uncertainty runs/demo --out runs/demo-uncertainty.parquet",
    "replicates": "topdown replicates runs/demo --n 50 --out runs/demo-replicates",
    "audit": "topdown audit demo --input demo-input --move 440070001023003:440070001011006 --runs 200",
    "spine": "topdown spine --baf data/ri_baf2020 --out ri-spine",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("census-topdown")
    except PackageNotFoundError:  # a source tree on PYTHONPATH without an install
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topdown", description="The Census TopDown Algorithm on Dask.",
                                     epilog=f"run `topdown COMMAND --help` for a command's arguments and an example. "
                                            f"{EXIT_CODES_HELP}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"topdown (census-topdown) {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _command(sub, "run", help="run TopDown end to end")
    p.add_argument("config", help="TOML configuration file or shipped preset name (e.g. demo)")
    p.add_argument("--out", required=True, help="run directory to write (absent, empty, or an earlier run directory)")
    p.add_argument("--input", help="input directory: persons.parquet and units.parquet, or directories persons/ and units/ of Parquet files (overrides [run] input)")
    _cluster_args(p)
    p.add_argument("--seed", type=int, help="override the configured seed (test mode)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run after its last complete level")
    p.add_argument("--force", action="store_true", help="recompute a run directory that is already complete "
                                                        "(removes every output of the earlier run)")
    p.add_argument("--redraw", action="store_true", help="production: draw noise again over levels already released "
                                                         "(a second release; the certificate composes both draws)")
    p.set_defaults(fn=cmd_run)

    p = _command(sub, "reprocess", help="estimate again from a run's published noisy measurements (no new noise, "
                                         "no privacy loss added)")
    p.add_argument("run", help="complete run directory whose noisy measurements and invariants are read, or a "
                               "noisy measurement file (`topdown nmf`, or the Bureau's 2020 layout; then --spine and "
                               "--config are needed)")
    p.add_argument("--out", required=True, help="new run directory to write")
    p.add_argument("--config", help="TOML file of post-processing changes (estimation settings, constraints) "
                                    "overriding the run's configuration key by key; for a noisy measurement file, the "
                                    "configuration it was measured with (post-processing keys free to change)")
    p.add_argument("--spine", help="for a noisy measurement file: the spine it was measured on (a run's "
                                   "spine.parquet or `topdown spine` output)")
    _cluster_args(p)
    p.add_argument("--resume", action="store_true", help="continue an interrupted reprocessing")
    p.add_argument("--force", action="store_true", help="recompute a directory that is already complete")
    p.set_defaults(fn=cmd_reprocess)

    p = _command(sub, "batch", help="run a list of runs and reprocessings unattended on one Dask cluster")
    p.add_argument("jobs", help="TOML jobs file ([batch] settings and [[job]] entries; docs/how-to/batch.md)")
    p.add_argument("--summary", help="JSON summary to write (default: <jobs stem>.summary.json beside the jobs file)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for another batch over the same jobs to finish (default: exit 4 at once)")
    _quiet_arg(p)
    p.set_defaults(fn=cmd_batch)

    p = _command(sub, "verify", help="re-check a run directory")
    p.add_argument("run", help="a run directory (exit 1 when a check fails, 4 when it holds no complete run)")
    p.set_defaults(fn=cmd_verify)

    p = _command(sub, "privacy", help="print the privacy certificate of a configuration")
    p.add_argument("config", help="TOML configuration file or shipped preset name (e.g. pl94_production_2021)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON certificate to this file (default: print only); it replaces "
                                 "only an earlier certificate")
    p.set_defaults(fn=cmd_privacy)

    p = _command(sub, "demo-data", help="write the bundled demo input (2018 End-to-End prototype, 569 blocks)")
    p.add_argument("out", help="directory to write persons.parquet and units.parquet into")
    p.set_defaults(fn=cmd_demo_data)

    p = _command(sub, "synth", help="write synthetic census-like input")
    p.add_argument("--blocks", type=int, help="number of blocks (at least 1) of P.L. 94-171 shaped input")
    p.add_argument("--census", help="a declared census (shipped name such as e2e_1940, dhc_1940, chile_2017, or a "
                   "declaration file): write input of its shape, exactly --persons persons, hive-partitioned by "
                   "the first level below the root")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    p.add_argument("--persons", type=int, help="with --census: the number of persons; else about this many persons "
                   "(the block sizes are scaled), in the partitioned layout")
    p.add_argument("--states", type=int, help="spread the blocks over this many states, written hive-partitioned by "
                   "state (persons/state=SS/, units/state=SS/), streaming, a batch of blocks at a time")
    p.add_argument("--shape", choices=["us2020"], help="us2020: the nation of 2020 (52 state-equivalents with their "
                   "FIPS codes, persons, counties, tracts, block groups and blocks; a quarter of the blocks without "
                   "persons, holding vacant units), hive-partitioned by state, with block assignment files in OUT/baf/")
    p.add_argument("--scale", type=float, help="with --shape: shrink persons, blocks, tracts and block groups by this "
                   "factor in (0, 1] (every state and county stays; default 1)")
    p.add_argument("out", help="directory to write the input into")
    p.set_defaults(fn=cmd_synth)

    p = _command(sub, "ingest", help="turn published tables into CEF-like input")
    p.add_argument("format", choices=["pl94", "blocks"], help="pl94: legacy-format P.L. 94-171 files; blocks: block CSV")
    p.add_argument("source", help="directory (pl94) or CSV file (blocks)")
    p.add_argument("--out", required=True, help="input directory to write (persons.parquet, units.parquet); "
                                                "confidential when the tables are")
    p.add_argument("--races", choices=RACE_CHOICES,
                   help="blocks: how the collapsed groups (two or more races, Hispanic) get race combinations: "
                        "spread person by person (default) or compact, one per block and group "
                        "(docs/reference/input.md)")
    _quiet_arg(p)
    p.set_defaults(fn=cmd_ingest)

    p = _command(sub, "evaluate", help="accuracy of one or more runs against the truth (tables, figures, HTML)")
    p.add_argument("runs", nargs="+", help="run directories (several: replicates with different seeds)")
    p.add_argument("--truth", required=True, help="the input directory the runs protected")
    p.add_argument("--entities", help="block-to-entity table (CSV/Parquet geoid,entity_type,entity) or a BAF directory")
    p.add_argument("--out", help="output directory (default RUN-evaluation-CONFIDENTIAL beside RUN); the output is "
                                 "computed from the truth and is confidential")
    p.add_argument("--no-suppress", action="store_true",
                   help="keep statistics over fewer than 3 geounits (they pin down true counts; default: suppressed)")
    p.add_argument("--audit", help="output directory of `topdown audit`: its bounds are shown beside the EPL")
    _cluster_args(p)
    p.add_argument("--uncertainty", help="a `topdown uncertainty` file of the first run: interval figure and coverage")
    p.set_defaults(fn=cmd_evaluate)

    p = _command(sub, "nmf", help="write a run's noisy measurement file (the Bureau's 2020 DPQuery/Constraint layout)")
    p.add_argument("run", help="a complete run directory")
    p.add_argument("--out", required=True, help="directory to create (must not exist or be empty)")
    _quiet_arg(p)
    p.set_defaults(fn=cmd_nmf)

    p = _command(sub, "uncertainty", help="GLS estimates, variances and 90/95%% intervals of every count (noisy "
                                           "measurements only)")
    p.add_argument("run", help="a complete run directory, or a noisy measurement file (`topdown nmf`, or the "
                                "Bureau's 2020 layout; then --spine and --config are needed)")
    p.add_argument("--out", required=True, help="Parquet file to write")
    p.add_argument("--spine", help="with a noisy measurement file: the spine file it was measured on")
    p.add_argument("--config", help="with a noisy measurement file: the configuration it was measured with")
    p.add_argument("--entities", help="block-to-entity table (CSV/Parquet geoid,entity_type,entity) or a BAF directory")
    p.add_argument("--levels", nargs="+", help="spine levels to write (default: all)")
    p.add_argument("--replicates", help="directory of `topdown replicates`: add an `amc` row (the Bureau's approximate "
                                        "Monte Carlo interval of the published count) after every `gls` row")
    p.add_argument("--calibrate", help="with --replicates: `topdown replicates` of one of its replicates (e.g. "
                                       "REPS/rep-000 --n 10): add a `calibrated` row, an experimental interval of the "
                                       "published count (not nominal on real data; docs/how-to/uncertainty.md)")
    _cluster_args(p)
    p.set_defaults(fn=cmd_uncertainty)

    p = _command(sub, "replicates", help="rerun TopDown on a run's own MDF with fresh seeds (approximate Monte "
                                          "Carlo; no privacy budget)")
    p.add_argument("run", help="a complete run directory")
    p.add_argument("--n", type=int, default=50, help="number of replicates (default 50)")
    p.add_argument("--out", required=True, help="replicates directory (resumable: finished replicates are kept)")
    p.add_argument("--parallel", type=int, help="replicates run side by side on the cluster (default 2)")
    _cluster_args(p)
    p.set_defaults(fn=cmd_replicates)

    p = _command(sub, "audit", help="direct empirical privacy loss: N runs on the input and N with one person moved")
    p.add_argument("config", help="TOML configuration file or shipped preset name")
    p.add_argument("--input", required=True, help="input directory of the census's records (persons.parquet, ...)")
    p.add_argument("--move", required=True, help="FROM:TO, the leaf geocodes (U.S.: block GEOIDs) one record of the run's "
                                                 "first product (a person) moves between")
    p.add_argument("--runs", type=int, required=True, help="runs on each database (N)")
    p.add_argument("--queries", default="total,detailed", help="audited queries, comma-separated (default total,detailed)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the runs (test-mode noise; default 0)")
    p.add_argument("--out", help="output directory (default runs/<name>-audit-CONFIDENTIAL); the output is confidential")
    _cluster_args(p)
    p.set_defaults(fn=cmd_audit)

    p = _command(sub, "spine", help="build the optimized spine from block assignment files and report on it")
    p.add_argument("--baf", required=True, help="directory of BlockAssign_*.txt files")
    p.add_argument("--units", help="units.parquet (GQ signatures for custom block groups)")
    p.add_argument("--out", required=True, help="directory for the spine and its report")
    p.set_defaults(fn=cmd_spine)
    return parser


def _command(sub, name: str, help: str) -> argparse.ArgumentParser:
    """A command's parser: its one-line help (also its description) and, after its arguments, an example
    and the exit codes."""
    return sub.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog=f"example:\n  {EXAMPLES[name]}\n\n{textwrap.fill(EXIT_CODES_HELP, 79)}")


def input_errors() -> tuple[type[ValueError], ...]:
    """The declared errors of bad input data (exit 3). Any other exception, a plain ValueError included (a
    NumPy shape mismatch, a broken assumption in our code), is a bug: exit 6 with its traceback."""
    from topdown.geo import GeographyError

    from .evaluation.evaluate import EvaluationError
    from .evaluation.gls import GLSError
    from .inputs.invariants import InvariantError
    from .inputs.ingest import IngestError
    from .configuration.errors import InputError

    return InputError, IngestError, InvariantError, GeographyError, EvaluationError, GLSError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet = getattr(args, "quiet", False)
    # --quiet: no bars and no INFO lines, so that stderr holds warnings and errors only
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    from .runtime.storage import CLIENT_LOGGERS

    for store_client in CLIENT_LOGGERS:  # an object store's client: its INFO lines are noise (DEBUG: storage.py)
        logging.getLogger(store_client).setLevel(logging.INFO if args.verbose else logging.WARNING)
    if hasattr(args, "workers") or args.command == "batch":  # the commands that start or join a Dask cluster
        _quiet_cluster_logs(args.verbose)
    from .runtime.progress import command_reporting

    try:
        _check_limits(parser, args)
        with _command_setup(args), _no_new_empty_out(args), signals_interrupt(), command_reporting(quiet):
            return args.fn(args)
    except BrokenPipeError:
        if not _stdout_closed():
            return _failed(BrokenPipeError(), args)
        # the reader of stdout left (`topdown ... | head`): stop quietly, as a Unix tool killed by SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit writes nothing
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt as exc:  # Interrupted, or a KeyboardInterrupt raised elsewhere
        signum = getattr(exc, "signum", signal.SIGINT)
        name = signal.Signals(signum).name
        again = "; the run directory is resumable with --resume" if hasattr(args, "resume") else ""
        # a new line first: the signal may have come while a progress bar was writing its own line
        print(f"\ntopdown: interrupted by {name}{again}", file=sys.stderr)
        return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED
    except Exception as exc:
        return _failed(exc, args)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has closed it."""
    import select

    if not hasattr(select, "poll"):
        return True
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):  # no file descriptor behind sys.stdout
        return False


@contextmanager
def _no_new_empty_out(args: argparse.Namespace) -> Iterator[None]:
    """A command that fails (refused before it started: bad configuration or input, over budget, locked)
    leaves no empty --out folder, nor folder above it, that it created."""
    out = getattr(args, "out", None)
    if not out:
        yield
        return
    from .runtime.outdir import made_then_removed_on_failure

    from .runtime.storage import location

    with made_then_removed_on_failure(location(out)):
        yield


def _quiet_cluster_logs(verbose: bool) -> None:
    """Dask's and the solvers' loggers at WARNING (DEBUG with -v). ``distributed`` configures its loggers when
    imported, so it is imported first; only the commands that use a cluster pay for that import."""
    import warnings

    import distributed  # noqa: F401

    for noisy in ("distributed", "pyomo", "asyncio", "tornado", "bokeh"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    # Chunks carry their parents' data by design (a task holds whole parents).
    warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)


def _failed(exc: Exception, args: argparse.Namespace) -> int:
    """One line on stderr and the documented exit code of a command's failure; anything unforeseen is a bug:
    exit 6 with the traceback for a report. The error classes are imported here, on the failure path only (the
    module that raised one is loaded already), so that a command starts without the modules it does not use."""
    from topdown.solvers.failsafe import FailsafeExhausted

    from .configuration.config import ConfigError
    from .configuration.limits import NAME_MAX
    from .runtime.rundir import RunDirError, unwritable
    from .execution.tasks import EstimationError

    if isinstance(exc, ConfigError):
        print(f"topdown: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if isinstance(exc, RunDirError):
        print(f"topdown: {exc}", file=sys.stderr)
        return EXIT_RUNDIR
    if isinstance(exc, (EstimationError, FailsafeExhausted)):
        print(f"topdown: estimation failed: {exc}", file=sys.stderr)
        return EXIT_ESTIMATION
    if isinstance(exc, (*input_errors(), FileNotFoundError)):  # declared input errors only: not a bare ValueError
        print(f"topdown: input error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:  # a name from a file, not an argument
        print(f"topdown: configuration error: {exc.filename}: a name too long for the file system (at most "
              f"{NAME_MAX} bytes per name)", file=sys.stderr)
        return EXIT_CONFIG
    out = getattr(args, "out", None)
    refused = unwritable(exc, getattr(exc, "filename", None) or out, out)
    if refused is not None:  # a full disk, a read-only or forbidden place: the output's problem, not a bug
        print(f"topdown: {refused}", file=sys.stderr)
        return EXIT_RUNDIR
    import traceback

    traceback.print_exception(exc)
    print(f"topdown: internal error ({type(exc).__name__}); please report it with the traceback above",
          file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
