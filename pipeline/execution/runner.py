"""``topdown.pipeline.run``: the whole flow of DESIGN.md ("A run's data flow") for one configuration.

ingest and validate -> spine -> tabulate and roll up -> invariants and constraints -> per level:
measure and estimate (Dask) -> MDF -> certificate and manifest.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from collections.abc import Mapping
from typing import Callable, Iterator

import dask
import numpy as np
import pandas as pd
import scipy.sparse as sp
from distributed import Security

from topdown.geo.spine import Spine, build_spine

from ..privacy.certificate import certificate, warn_not_private, with_draws
from .cluster import (DASHBOARD_ADDRESS, DASHBOARD_KEY, NO_DASHBOARD, QuietTaskErrors, check_main_guarded,
                      check_scheduler, embedded_security, quiet_closing, workers_ignore_stop_signals)
from ..privacy.accounting import bypass_report
from ..configuration.config import (Config, ConfigError, census_hierarchy, config_from_dict,
                                    differing_keys, leaves, load_config)
from .dataplane import (find_input, input_geography, gq_presence, read_input, tabulate_levels, write_invariants_table,
                        write_mdf)
from .engine import (LevelReport, ProgressFn, changed_level, distrust, estimate_level,
                     read_level_histograms, read_level_output, write_level_histograms)
from ..inputs.invariants import UNIT_COLUMNS, WHOLE_STATE, invariant_rows
from .levels import Level, Shares, rollup, shares
from .memory import limit_heaps, release_memory
from ..runtime.progress import Steps, chain, reporter
from .published import check_matched, matched_levels
from .preflight import check_baf_states, check_derived_units, check_workers, preflight, read_baf
from ..privacy.release import prior_draws
from ..runtime.private_files import private_dir
from ..runtime.outdir import MARKER_FIELDS, check, claimed, read_marker
from ..runtime.rundir import (SCHEMA_VERSION, STAGING, RunDir, RunDirError, level_digests, sha256_file,
                              write_json_atomic, write_table)
from ..runtime.storage import StorePath, location
from topdown.vocab.census import Product
from .sources import DRAW, MeasurementSource
from ..inputs.validate import UNIT_RECORDS

log = logging.getLogger("topdown")

#: Environment that pins BLAS and solver threads to one per worker process.
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                     "RAYON_NUM_THREADS": "1"}


#: Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (``distributed.nanny.pre-spawn-environ``)
#: so that they hand freed memory back at once, and writes it into the starting process's environment.
#: Setting it also turns off glibc's adaptive mmap threshold: every array above 128 kB is mapped and
#: unmapped anew, and a quarter of a worker's CPU went to the kernel's page faults (RI 2010: 7 of 27 CPU
#: seconds per worker; 1.9 with glibc's defaults, for 20-50 MB more resident). The embedded cluster's workers
#: keep glibc's defaults (benchmarks/RESULTS_cpu.md); docs/how-to/clusters.md says how to do the same on a
#: cluster of your own.
GLIBC_ENV = ("MALLOC_TRIM_THRESHOLD_",)
GLIBC_DEFAULTS = {f"distributed.nanny.pre-spawn-environ.{name}": None for name in GLIBC_ENV}
#: The embedded cluster's workers allocate Arrow's buffers with glibc (``system``), whose freed memory the next
#: allocations reuse; Arrow's default pool (mimalloc) kept more resident: workers' high-water -12 % over a run,
#: the same CPU (benchmarks/RESULTS_national.md section 8).
WORKER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system"}


@contextmanager
def _env_kept(*names: str) -> Iterator[None]:
    """``names`` in this process's environment afterwards as before (a nanny writes its workers' pre-spawn
    variables into it)."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _unset_env(*names: str) -> Iterator[None]:
    """``names`` absent from this process's environment (which spawned workers inherit), restored after."""
    with _env_kept(*names):
        for name in names:
            os.environ.pop(name, None)
        yield


#: Timers of an embedded cluster's driver process, which holds the scheduler and the workers' nannies: Dask's
#: defaults (an event-loop tick every 20 ms in each of them, each nanny polling its worker's memory every 100 ms,
#: the scheduler's system monitor every 500 ms) cost the driver 36 ms of CPU a second with nothing to do, about
#: 2 % of two busy workers; these cost it about 7 (benchmarks/RESULTS_national.md, "The driver's CPU"). A worker
#: above its memory limit is still stopped by its nanny, within a second instead of 0.1 s.
QUIET_TIMERS = {"distributed.admin.tick.interval": "1s", "distributed.worker.memory.monitor-interval": "1s",
                "distributed.admin.system-monitor.interval": "2s"}


@contextmanager
def embedded_settings() -> Iterator[None]:
    """What an embedded cluster is started under (here and by benchmarks/run_stages.py): the scheduler's
    short debugging logs, quiet timers (:data:`QUIET_TIMERS`), glibc's malloc defaults and :data:`WORKER_ENV`
    for the workers."""
    spawn = {f"distributed.nanny.pre-spawn-environ.{name}": value for name, value in WORKER_ENV.items()}
    with dask.config.set({"distributed.admin.low-level-log-length": SCHEDULER_LOG_LENGTH, **GLIBC_DEFAULTS,
                          **spawn, **QUIET_TIMERS}), _unset_env(*GLIBC_ENV), _env_kept(*WORKER_ENV):
        yield


class AlreadyComplete(RunDirError):
    """The run directory holds a complete run; use force to recompute."""


#: Messages the driver's client and embedded scheduler keep per connection, and transitions, for debugging.
#: Dask's 1,000 keep the arguments of the last 1,000 tasks sent over each connection in the driver.
SCHEDULER_LOG_LENGTH = 50
#: How long a client waits for a scheduler named by ``--scheduler`` (Dask's setting: 30 s unless configured).
CONNECT_TIMEOUT = "distributed.comm.timeouts.connect"


@contextmanager
def dask_client(client=None, scheduler: str | None = None, workers: int | None = None,
                security: Security | None = None) -> Iterator:
    """The given client, a client of an existing scheduler (TLS with ``security``, a
    ``distributed.Security``, or the Dask configuration's), or an embedded LocalCluster of processes
    that only holders of its temporary TLS credentials can join (cluster.py)."""
    from distributed import Client, LocalCluster

    limit_heaps()
    if client is not None:
        yield client
        return
    if scheduler:
        security = check_scheduler(scheduler, security)
        wait = dask.config.get(CONNECT_TIMEOUT)
        try:
            with dask.config.set({"distributed.admin.low-level-log-length": SCHEDULER_LOG_LENGTH}):
                c = Client(scheduler, timeout=wait, security=security)
        except (OSError, TimeoutError) as exc:
            raise ConfigError(f"cannot reach the Dask scheduler at {scheduler} within "
                              f"{wait} ({exc}; to wait longer, set Dask's "
                              f"{CONNECT_TIMEOUT}, e.g. DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=60s)") from None
        with c:
            yield c
        return
    check_workers(workers)
    check_main_guarded()
    os.environ.update(SINGLE_THREAD_ENV)
    n = workers or max(1, os.cpu_count() or 1)
    dashboard = bool(dask.config.get(DASHBOARD_KEY, False))
    with embedded_settings(), dask.config.set({} if dashboard else NO_DASHBOARD):
        with workers_ignore_stop_signals():
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                   dashboard_address=DASHBOARD_ADDRESS, scheduler_kwargs={"dashboard": dashboard},
                                   host="127.0.0.1", silence_logs=logging.ERROR, security=embedded_security())
        with quiet_closing() as quiet, cluster, Client(cluster) as c:
            c.register_plugin(QuietTaskErrors())
            log.info("embedded Dask cluster: %d worker processes (TLS, temporary credentials)", n)
            if dashboard:
                print(f"topdown: Dask dashboard at {c.dashboard_link} (127.0.0.1 only; any local user can open it "
                      "while this command runs)", file=sys.stderr, flush=True)
            try:
                yield c
            finally:
                quiet()  # the client and the cluster close next


def _input_dir(config: Config, input_dir: str | Path | None) -> Path | StorePath:
    path = location(input_dir or config.run.input)
    if config.run.build_demo_input and not (path / "persons.parquet").exists():
        from ..inputs.demo_data import write_demo_input

        log.info("building the demo input in %s", path)
        write_demo_input(path)
    find_input(path, config.census)  # FileNotFoundError naming what is missing
    return path


def configure_run(path: str | Path, input_dir: str | Path | None = None, seed: int | None = None) -> Config:
    """The configuration of ``topdown run PATH [--input DIR] [--seed N]``."""
    config = with_input(load_config(path), input_dir)
    return config.with_overrides(seed=seed) if seed is not None else config


def with_input(config: Config, input_dir: str | Path | None) -> Config:
    """``config`` reading ``input_dir`` when one is given: recorded as the run's input (config.json says what was
    read, from the command line and the API alike); an explicit input directory must exist, never filled with
    the demo data."""
    if not input_dir:
        return config
    return config.with_overrides(input=str(input_dir), build_demo_input=False)


def run(
    config: Config | str | Path, out: str | Path | None = None, *, input_dir: str | Path | None = None, client=None, scheduler: str | None = None,
    workers: int | None = None, resume: bool = False, force: bool = False, progress: ProgressFn | None = None,
    security: Security | None = None, redraw: bool = False,
) -> Path:
    """Run TopDown for ``config`` (a Config, a TOML path or a preset name) into the run directory ``out``
    (default ``runs/<name>``). Uses ``client`` if given, else a client of ``scheduler`` (TLS credentials:
    ``security``, a ``distributed.Security``), else an embedded LocalCluster of ``workers`` processes.
    ``redraw`` lets a production run draw again over levels already released (release.py).
    Returns the run directory's path."""
    if not isinstance(config, Config):
        config = load_config(config)
    config = with_input(config, input_dir)
    if config.run.algorithm == "block_by_block":
        config = block_by_block_config(config)
    preflight(config, workers)
    check_matched(config)  # the earlier runs named by match_published, before the input is read
    warn_not_private(config)
    bafs = [read_baf(config)]  # checked before anything is written; the spine's build takes it (_tabulate)
    if scheduler and client is None:  # a bad address or missing credentials: refused before anything is written
        security = check_scheduler(scheduler, security)
    if client is None and not scheduler:
        check_main_guarded()
    out, _ = check(out if out is not None else Path("runs") / config.run.name, "run")
    inp = _input_dir(config, input_dir)
    check_derived_units(config, find_input(inp, config.census).units)
    hashes = input_hashes(config, inp)
    rundir = RunDir(out)
    with opened(rundir, config, hashes, resume, force, draws=True, redraw=redraw) as (manifest, prior):
        return _run_locked(config, rundir, manifest, inp, hashes, client, scheduler, workers, progress, bafs, security,
                           prior)


@contextmanager
def opened(rundir: RunDir, config: Config, hashes: dict[str, str], resume: bool, force: bool, *, draws: bool = False,
           redraw: bool = False, command: str = "run") -> Iterator[tuple[dict, list[dict]]]:
    """Hold ``rundir`` for ``command`` (``outdir.claimed``: absent, empty or an earlier output of it; locked);
    yield the manifest to continue (--resume: same configuration and inputs) or {}, and, for a run that
    ``draws`` noise, the earlier draws of this directory it composes with (release.py).

    A complete run is refused without ``force`` (or ``redraw``); ``resume`` with ``force`` is refused (resuming a
    complete run would recompute nothing)."""
    if resume and force:
        raise ConfigError("--resume and --force together: --resume continues an interrupted run, --force recomputes "
                          "a complete one; give one")
    with claimed(rundir.root, command):
        rundir.check_layout(config.run.products)
        manifest = rundir.read_manifest()
        if set(manifest) <= {"schema_version", *MARKER_FIELDS}:  # the marker alone: no run started here yet
            manifest = {}
        if manifest.get("status") == "complete" and not (force or redraw):
            again = ("--redraw to draw a second release (the certificate then composes both)"
                     if draws and config.run.mode == "production" else "--force to recompute it")
            raise AlreadyComplete(f"{rundir.root} already holds a complete run (config "
                                  f"{manifest.get('config_hash', '?')[:12]}); use {again}")
        check_resumable(rundir, manifest, config, resume)
        if manifest and resume:
            check_inputs(rundir, manifest, hashes)
        prior = prior_draws(rundir, config, manifest, resume, redraw) if draws else []
        if not resume:  # --resume keeps the chunks an interrupted level had finished
            rundir.clear_staging()
        yield (manifest if resume else {}), prior


def check_resumable(rundir: RunDir, manifest: dict, config: Config, resume: bool) -> None:
    """--resume continues only a run of the same configuration."""
    if manifest and resume and not config.matches(manifest.get("config_hash")):
        raise RunDirError(f"{rundir.root} holds a run of a different configuration; cannot resume it"
                          f"{_differences(rundir, config)}")


def _differences(rundir: RunDir, config: Config) -> str:
    """Which keys of ``config`` differ from the run's recorded config.json (a clause), if it can be read: a
    run started before a default changed (such as ``backend``) differs only there."""
    try:
        recorded = json.loads(rundir.config_path.read_text())
    except (OSError, ValueError):
        return ""
    keys = differing_keys(recorded, config.model_dump(mode="json"))
    if not keys:
        return ""
    run = leaves(recorded)
    shown = ", ".join(f"{k} (run: {run.get(k)!r})" for k in keys[:5])
    return f" (it differs in {shown}{f' and {len(keys) - 5} more' if len(keys) > 5 else ''})"


def check_inputs(rundir: RunDir, manifest: dict, hashes: dict[str, str]) -> None:
    """--resume continues only a run of the same input files (SHA-256 recorded in the manifest)."""
    recorded = manifest.get("input_sha256")
    if recorded is None:
        log.warning("%s: the manifest records no input hashes (an older run); the input is not checked", rundir.root)
        return
    changed = sorted(k for k in set(recorded) | set(hashes) if recorded.get(k) != hashes.get(k))
    if changed:
        raise RunDirError(f"{rundir.root} holds a run of different input files ({', '.join(changed)} changed); "
                          "cannot resume it")


def input_hashes(config: Config, inp: Path) -> dict[str, str]:
    """SHA-256 of every input file a run reads: the person and unit files (by path below the input
    directory), and the block assignment files when the spine is built from them."""
    hashes = find_input(inp, config.census).hashes()
    if config.run.spine != "standard" and config.run.baf:
        baf = Path(config.run.baf)
        for f in sorted(baf.iterdir()) if baf.is_dir() else [baf]:
            if f.is_file():
                hashes[f"baf/{f.name}"] = sha256_file(f)
    return hashes


def _run_locked(config: Config, rundir: RunDir, manifest: dict, inp: Path, hashes: dict[str, str], client, scheduler,
                workers, progress: ProgressFn | None, bafs: list[pd.DataFrame | None], security: Security | None,
                prior: list[dict]) -> Path:
    fresh = not manifest  # {} unless --resume continues a run
    t0 = time.perf_counter()
    timings: dict[str, float] = manifest.setdefault("timings", {})
    steps = Steps("run start-up", 3 + len(config.run.products))
    steps.start("cluster")
    # The cluster comes up (or an unreachable scheduler is reported) before anything is written; the workers
    # read, check and tabulate the input (dataplane.py), and every check runs before the first write.
    with dask_client(client, scheduler, workers, security) as dclient:
        prep = _tabulate(config, inp, hashes, dclient, bafs, timings, steps)
        steps.close()
        return execute(config, rundir, manifest, _plan(config, prep, dclient, prior), dclient, None, None, progress,
                       t0, security, fresh=fresh)


@dataclass
class Prepared:
    """A run's input read, checked and tabulated on the workers, its spine built and its path shares
    computed: all that runs of one input differing only in their seed (replicates) share."""

    config: Config
    spine: Spine
    levels: dict[str, list[Level]]  # per product, top-down; the true histograms stay on the workers
    shares: dict[str, "PathShares"]
    hashes: dict[str, str]
    timings: dict[str, float]


def _tabulate(config: Config, inp: Path, hashes: dict[str, str], dclient, bafs: list[pd.DataFrame | None],
              timings: dict[str, float], steps: Steps | None = None) -> Prepared:
    """Ingest, spine and tabulation on ``dclient``'s workers (``steps``: the start-up bar). ``bafs`` holds the
    block assignment frame (or None), taken out of it here: the driver frees it once the spine is built, before the
    tabulation's peak."""
    step = steps.start if steps is not None else (lambda name: None)
    t0 = time.perf_counter()
    census = config.census
    files = find_input(inp, census)
    step("ingest")
    data = read_input(dclient, files, census)
    release_memory()
    timings["ingest"] = time.perf_counter() - t0

    t = time.perf_counter()
    step("spine")
    geoids = input_geography(data, census_hierarchy(config))
    baf = bafs.pop()
    if baf is not None:
        check_baf_states(config, baf, geoids, files.where(UNIT_RECORDS))
    spine = build_spine(config.run.spine, geoids, baf_dir=baf,  # only the optimized spine reads the units
                        units=gq_presence(dclient, data) if config.run.spine == "optimized" else None,
                        hierarchy=census_hierarchy(config))
    del geoids, baf
    release_memory()
    timings["spine"] = time.perf_counter() - t

    shares = path_shares(spine, config)
    all_levels: dict[str, list[Level]] = {}
    products = tuple(config.run_products)
    for i, product in enumerate(products):
        t = time.perf_counter()
        step(f"tabulate {product.name}")
        all_levels[product.name] = tabulate_levels(dclient, config, product, spine, data, files, products[i + 1:],
                                                   all_levels[products[0].name] if i else None)
        release_memory()
        dclient.run(release_memory)  # the workers' freed read parts and transients, before the next product
        timings[f"{product.name}.tabulate"] = time.perf_counter() - t
    del data  # the shards hold the true histograms now
    release_memory()
    return Prepared(config, spine, all_levels, shares, hashes, dict(timings))


def _plan(config: Config, prep: Prepared, dclient, prior: list[dict], reused: bool = False) -> "Plan":
    """The plan of a run of ``config`` from ``prep`` (its certificate composing with ``prior`` draws; ``reused``:
    ``prep`` serves further runs, so its true histograms stay on the workers)."""
    cert = with_draws(certificate(config, prep.shares, bypass_reports(config, prep.shares)), prior or [])

    def publish(rd: RunDir) -> None:
        write_table(prep.spine.to_arrow(), rd.root / "spine.parquet")  # with kind, levels, budget moves
        for product in config.run_products:
            _write_invariants(dclient, rd, product, prep.levels[product.name])

    return Plan(prep.spine, prep.levels, cert, publish, lambda rd, product, level: DRAW, {"input_sha256": prep.hashes},
                release=not reused)


def prepare(config: Config, input_dir: str | Path, client) -> Prepared:
    """Read, check and tabulate ``input_dir`` for ``config`` once on ``client``'s workers, for
    :func:`run_prepared` (the replicates of a run: one input, many seeds). The checks are those of :func:`run`."""
    if config.run.algorithm == "block_by_block":
        config = block_by_block_config(config)
    preflight(config, None)
    check_matched(config)
    bafs = [read_baf(config)]
    inp = _input_dir(config, input_dir)
    check_derived_units(config, find_input(inp, config.census).units)
    return _tabulate(config, inp, input_hashes(config, inp), client, bafs, {})


def run_prepared(config: Config, out: str | Path, prep: Prepared, client) -> Path:
    """Run ``config`` into the new run directory ``out`` from ``prep`` (:func:`prepare`, for a
    configuration that differs from ``config`` at most in its name and seed): the same files as
    :func:`run` of ``config`` on that input."""
    if config.run.algorithm == "block_by_block":
        config = block_by_block_config(config)
    same = config.with_overrides(name=prep.config.run.name, seed=prep.config.run.seed)
    if same.digest() != prep.config.digest():
        raise ValueError(f"the input was prepared for another configuration than {config.run.name}'s")
    rundir = RunDir(check(out, "run")[0])
    with opened(rundir, config, prep.hashes, resume=False, force=False, draws=True) as (manifest, prior):
        manifest["timings"] = dict(prep.timings)
        return execute(config, rundir, manifest, _plan(config, prep, client, prior, reused=True), client, None, None, None,
                       time.perf_counter(), fresh=True)


@dataclass
class Plan:
    """Everything the estimation of a run directory needs, checked before the first write."""

    spine: Spine
    levels: dict[str, list[Level]]  # per product, top-down
    certificate: dict
    publish: Callable[[RunDir], None]  # writes (or links) the spine and the invariants
    source: Callable[[RunDir, str, Level], MeasurementSource]  # per product and level: drawn or published
    manifest: dict  # extra manifest entries (input hashes, the run reprocessed)
    release: bool = False  # drop each level's true histograms from the workers once it is estimated (a one-off run)


def execute(config: Config, rundir: RunDir, manifest: dict, plan: Plan, client, scheduler, workers,
            progress: ProgressFn | None, t0: float, security: Security | None = None, fresh: bool = False) -> Path:
    """Estimate every product level by level into ``rundir`` (holding its lock), then the MDF and the manifest.
    ``fresh``: a new run, so every output of an earlier one is removed first."""
    timings: dict[str, float] = manifest.setdefault("timings", {})
    progress = chain(reporter().tasks, progress)  # the bars of the command line or a Job, and the caller's
    # The cluster comes up (or an unreachable scheduler is reported) before anything is written.
    marker = read_marker(rundir.root)  # the run directory's own (outdir.claimed wrote it)
    if marker is None:
        raise RunDirError(f"{rundir.manifest_path}: the run directory's marker was removed while the run held it")
    matched = check_matched(config)
    matched_levels(matched, plan.spine, plan.levels)  # the spines compared before anything is written
    for product, m in matched.items():  # public counts: recorded beside the product's budget, at no cost
        plan.certificate[product] = {**plan.certificate[product], "match_published": m.record()}
    with dask_client(client, scheduler, workers, security) as dclient:
        if fresh:  # nothing of an earlier run survives beside this one's outputs
            rundir.clear_outputs(marker)
        private_dir(rundir.root / STAGING)  # unpublished chunks: their owner's alone
        plan.publish(rundir)
        write_json_atomic(rundir.config_path, config.model_dump(mode="json"))  # public: reprocess, nmf, uncertainty
        write_json_atomic(rundir.root / "certificate.json", plan.certificate)
        completed: dict[str, list[str]] = manifest.get("completed", {})
        cert = plan.certificate
        manifest.update({
            **marker, "schema_version": SCHEMA_VERSION, "status": "running", "name": config.run.name, "config_hash": config.digest(), "config_source": config.source,
            "algorithm": config.run.algorithm, "seed_mode": config.run.mode, "seed": config.run.seed,
            "spine": config.run.spine, "levels": plan.spine.levels,
            "products": list(config.run.products),
            "budgets": {p: {k: v for k, v in cert[p].items() if k in ("mechanism", "rho", "epsilon", "delta")}
                        for p in config.run.products}, "completed": completed,
            "parents_solved": manifest.get("parents_solved", {}), "failsafe": manifest.get("failsafe", []),
            "timings": timings, **plan.manifest,
            **({"match_published": {p: m.record() for p, m in matched.items()}} if matched else {}),
        })
        rundir.write_manifest(manifest)

        for product in config.run_products:
            levels = plan.levels[product.name]
            blocks = _estimate_product(dclient, rundir, config, product, levels, manifest, progress,
                                       lambda level: plan.source(rundir, product.name, level), plan.release)
            t = time.perf_counter()
            write_mdf(dclient, rundir, product, plan.spine, levels[-1], blocks, census_hierarchy(config))
            if plan.release:  # the product's last use of the blocks' metadata on the workers
                levels[-1].meta = None
            release_memory()
            timings[f"{product.name}.mdf"] = time.perf_counter() - t
            rundir.write_manifest(manifest)
    rundir.clear_staging()
    manifest["output_sha256"] = rundir.output_digests(list(config.run.products))  # verify re-checks them
    manifest["status"] = "complete"
    timings["total"] = time.perf_counter() - t0
    rundir.write_manifest(manifest)
    return rundir.root


def path_shares(spine, config: Config) -> dict[str, "PathShares"]:
    """Per product, per block, the budget share of its node at every level (Theorem 2's path condition input),
    made block by block as the certificate reads them (a dict per block of a national spine would not fit).
    The blocks' node codes are the same for every product: computed once and shared."""
    rolled = _rollups(spine)
    return {p: PathShares(spine, config.product(p).budget, rolled) for p in config.run.products}


def bypass_reports(config: Config, shares: dict[str, "PathShares"]) -> dict[str, dict]:
    """Per product whose spine moves budget onto single nodes, what it concentrates there
    (:func:`~..privacy.accounting.bypass_report`), also said on stderr: a warning where a node's query gets noise that
    is zero with probability above the production floor."""
    reports = {}
    for product, path in shares.items():
        report = bypass_report(config.product(product).budget, path.node_shares())
        if report is None:
            continue
        reports[product] = report
        top = report["largest"]
        (log.warning if report["nodes_above_floor"] else log.info)(
            "%s: the spine's bypassing gives %d nodes more than their level's share of the budget; %d of them have a "
            "query whose noise is zero with probability above %s (largest %.2f: %s \"%s\" at share %s); "
            "certificate.json: %s.bypassing", product, report["nodes"], report["nodes_above_floor"], report["floor"],
            top["exact_probability"], top["level"], top["query"], top["node_share"], product)
    return reports


def _rollups(spine) -> list[tuple]:
    """Each level's ``rollup`` of the spine: its nodes, and each block's node code."""
    return [rollup(spine.table[level]) for level in spine.levels]


class PathShares(Mapping):
    """Block geocode -> {level: share of the block's node at that level}, computed when read."""

    def __init__(self, spine, budget, rolled: list[tuple] | None = None) -> None:
        """``rolled``: each level's ``rollup`` of the spine (nodes, each block's node code), when already made."""
        self.levels = spine.levels
        rolled = rolled or _rollups(spine)
        # per level: each block's node code, and each node's share (levels.Shares)
        self.shares = [(codes, shares(spine, budget.levels, level, nodes))
                       for level, (nodes, codes) in zip(spine.levels, rolled)]
        self.blocks = pd.Index(spine.table[spine.levels[-1]], dtype="str")

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[str]:
        return iter(self.blocks)

    def __getitem__(self, block: str) -> dict[str, Fraction]:
        return self._path(self.blocks.get_loc(block))

    def _path(self, i: int) -> dict[str, Fraction]:
        return {lv: share[codes[i]] for lv, (codes, share) in zip(self.levels, self.shares)}

    def items(self) -> Iterator[tuple[str, dict[str, Fraction]]]:
        for i, block in enumerate(self.blocks):
            yield block, self._path(i)

    def node_shares(self) -> dict[str, Shares]:
        """Each level's nodes' budget shares."""
        return {level: share for level, (_, share) in zip(self.levels, self.shares)}

    def distinct(self) -> dict[str, dict[str, Fraction]]:
        """Each distinct path of shares once, at its first block, in block order (a national spine has
        millions of blocks and a handful of distinct paths)."""
        path = np.zeros(len(self.blocks), dtype=np.int64)  # each block's path of distinct shares, as one number
        for codes, share in self.shares:
            ids: dict[Fraction, int] = {}
            value_ids = np.array([ids.setdefault(f, len(ids)) for f in share.values], dtype=np.int64)
            if path.max(initial=0) >= np.iinfo(np.int64).max // max(len(ids), 1):
                _, path = np.unique(path, return_inverse=True)  # renumber: the number stays small
            path = path * len(ids) + value_ids[share.codes][codes]
        _, first = np.unique(path, return_index=True)
        return {self.blocks[i]: self._path(i) for i in np.sort(first)}


def _estimate_product(dclient, rundir: RunDir, config: Config, spec: Product, levels: list[Level], manifest: dict,
                      progress: ProgressFn | None, source: Callable[[Level], MeasurementSource], release: bool = False):
    """Top-down: every level estimated from its parents. Block-by-block: blocks alone, then summed up.
    ``release``: each level's true histograms are dropped from the workers once it is complete."""
    product = spec.name
    done = manifest["completed"].setdefault(product, [])
    solved = manifest["parents_solved"].setdefault(product, {})
    digests = manifest.setdefault("sha256", {}).setdefault(product, {})
    by_block = config.run.algorithm == "block_by_block"
    hist = None
    for i, level in enumerate(levels):
        if by_block and i < len(levels) - 1:
            continue
        parent = levels[i - 1] if i and not by_block else None
        if level.name in done:
            problem = changed_level(rundir, spec, level.name, digests.get(level.name))
            if problem is None:
                hist = read_level_output(rundir, spec, level)
                log.info("%s %s: complete in an earlier run, read back", product, level.name)
                if release:
                    level.parts = None
                continue
            distrust(problem, config.run.mode, f"{product} {level.name}",
                     "Run again without --resume (with --redraw: a second release) or restore the level's files")
            done.remove(level.name)
        hist, report = estimate_level(dclient, rundir, spec, config, level, parent, hist, progress,
                                      independent=by_block, source=source(level))
        _log_report(product, report)
        if release:
            level.parts = None
        release_memory()
        done.append(level.name)
        digests[level.name] = report.digests if report.digests is not None else level_digests(rundir, product,
                                                                                                level.name)
        solved[level.name] = {"parents": report.parents, "solved": report.solved, "copied": report.copied,
                              "tasks": report.tasks, "max_parent_seconds": round(report.max_parent_seconds, 3)}
        manifest["failsafe"].extend({"product": product, **f} for f in report.failsafe)
        manifest["timings"][f"{product}.{level.name}"] = round(report.seconds, 3)
        rundir.write_manifest(manifest)
    if by_block:  # the roll-up of the block-by-block algorithm runs in the driver
        up = read_level_histograms(rundir, spec, level)
        for child, level in zip(levels[:0:-1], levels[-2::-1]):
            up = sp.csr_matrix((np.ones(len(child)), (child.parent, np.arange(len(child)))),
                               shape=(len(level), len(child))) @ up
            write_level_histograms(rundir, spec, level, up.astype(np.int64).tocsr())
            digests[level.name] = level_digests(rundir, product, level.name)
            if level.name not in done:
                done.append(level.name)
        rundir.write_manifest(manifest)
    return hist


def block_by_block_config(config: Config) -> Config:
    """The block-by-block algorithm spends every product's whole budget on the block level."""
    data = config.model_dump(mode="json")
    leaf = census_hierarchy(config).leaf
    for product in config.run.products:
        levels = data[product]["budget"]["levels"]
        data[product]["budget"]["levels"] = {lv: ("1" if lv == leaf else "0") for lv in levels}
    return config_from_dict(data, source=config.source)


def _log_report(name: str, r: LevelReport) -> None:
    log.info("%s %s: %d parents (%d solved, %d copied) in %d tasks, %.1fs%s", name, r.level, r.parents, r.solved,
             r.copied, r.tasks, r.seconds, f", failsafe for {len(r.failsafe)} parent(s)" if r.failsafe else "")


def _write_invariants(client, rundir: RunDir, product: Product, levels: list[Level]) -> None:
    """The declared-public invariants (DAS-2020 ``person_US.ini``): the unit and GQ-facility counts of every node
    (sums of block invariants) and, for a product whose total is invariant, the total of every node where it is (``tot``:
    the root's; a declared census's down to the level it names) and each whole U.S. state's total (rows of level
    ``WHOLE_STATE``, geocode = state FIPS). A part of a state split by the AIAN spine has
    no total: only declared invariants are written. A partitioned run's block rows are on the shards
    (``Level.meta``): a worker adds them and writes the file."""
    frames = []
    total = product.total_invariant
    blocks = levels[-1] if levels[-1].units is None else None
    for level in levels[:-1] if blocks is not None else levels:
        # a node's total where invariant: the root, and (no U.S. state split) every level the total is declared
        # down to; the U.S. state level's totals are the whole states' rows below
        tot = level.units["tot"].to_numpy() if "tot" in level.units and level.state_total is None else np.nan
        frames.append(invariant_rows(level.units, level.name, tot if total else None))
        if total and level.state_total is not None:
            whole = level.units[UNIT_COLUMNS].groupby(level.state).sum()
            frames.append(whole.assign(tot=level.state_total.reindex(whole.index).to_numpy(dtype=float))
                          .reset_index(names="geocode").assign(level=WHOLE_STATE))
    path = rundir.invariants(product.name)
    if blocks is None:
        write_table(pd.concat(frames, ignore_index=True), rundir.staging(path))
    else:
        # The upper levels' rows scattered, not in the task's graph (55 MiB at national size), under keys of their
        # own: replicates sharing a cluster scatter equal rows at once, and a shared key would go with the first.
        upper = client.scatter(frames, hash=False)
        client.submit(write_invariants_table, upper, [p.future for p in blocks.meta], blocks.name, total,
                      str(rundir.staging(path)), pure=False).result()
    rundir.commit(path)
