"""Long solves are not taken for dead workers (solvers/isolated.py).

PIQP keeps the GIL while it solves; a large QP is solved in a helper process, so that a Dask worker's event
loop keeps sending heartbeats. The helper gives the same bits as a solve in process."""
from __future__ import annotations

import os

import dask
import distributed.scheduler
import numpy as np
import pytest
from distributed import Client, LocalCluster

from test_solver_scaling import dense_parent
from topdown.solvers import isolated, solve_parent
from topdown.solvers.backends import BACKENDS, ISOLATE_COLUMNS, PiqpHighs
from topdown.solvers.direct import compile_direct
from topdown.solvers.layout import build_layout


class Recording(PiqpHighs):
    """PiqpHighs that keeps every QP's result."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.results = []

    def qp(self, *args):
        res = super().qp(*args)
        self.results.append(res)
        return res


def test_an_isolated_solve_has_the_same_bits_as_one_in_process():
    problem = dense_parent(0, k=8, people=100_000, ncells=60)
    inside, helper = Recording(isolate_above=None), Recording(isolate_above=0)
    a, b = solve_parent(problem, inside), solve_parent(problem, helper)
    assert len(inside.results) == len(helper.results) == 2
    for r, s in zip(inside.results, helper.results):
        assert r.status == s.status == "Solved" and r.objective == s.objective
        assert r.x.tobytes() == s.x.tobytes()
    np.testing.assert_array_equal(a.hist, b.hist)


def test_the_default_back_end_isolates_large_qps_only():
    assert BACKENDS["piqp-highs"].isolate_above == ISOLATE_COLUMNS
    form = compile_direct(build_layout(dense_parent(1, k=3, people=3000, ncells=20)))
    assert form.shape[1] < ISOLATE_COLUMNS  # the demo's QPs are all below it (2,322 columns at most)


def test_the_helper_is_another_process_kept_for_the_thread_and_replaced_when_it_dies():
    """(The helper imports what it runs: functions of the standard library here, not of this file.)"""
    first = isolated.call(os.getpid)
    assert first != os.getpid() and isolated.call(os.getpid) == first
    with pytest.raises(ValueError, match="bad rows"):  # the function's own exception, raised here
        isolated.call(int, "bad rows")
    assert isolated.call(os.getpid) == first  # an exception leaves the helper in step
    with pytest.raises(isolated.HelperDied, match="exit status 3 during _exit"):
        isolated.call(os._exit, 3)
    assert isolated.call(os.getpid) not in (first, os.getpid())


def test_a_qp_whose_helper_process_crashes_is_solved_by_clarabel(monkeypatch, caplog):
    """PIQP's helper process ending during a solve (here killed by a signal, as PIQP's SIGSEGV on a root whose
    ordering fills past its index range ends it; SIGKILL leaves no core file) hands the QP to Clarabel at once,
    with a warning: the parent is solved with the bits of the Clarabel back end's solve."""
    import signal

    from topdown.solvers import backends

    tries = []

    def crashing(fn, *args):
        tries.append(fn.__name__)
        return isolated.call(os.kill, isolated.call(os.getpid), signal.SIGKILL)

    problem = dense_parent(0, k=8, people=100_000, ncells=60)
    reference = solve_parent(problem, backends.ClarabelHighs(PiqpHighs().loose_tol))
    monkeypatch.setattr(backends, "call_isolated", crashing)
    crashed = Recording(isolate_above=0)
    with caplog.at_level("WARNING", logger="topdown"):
        solution = solve_parent(problem, crashed)
    kill = signal.SIGKILL.value
    assert [r.status for r in crashed.results] == [f"PIQP crashed (signal {kill}), Clarabel Solved"] * 2
    assert tries == ["piqp_solve"] * 2  # no second PIQP try on the same matrices
    said = [r.message for r in caplog.records]
    assert len(said) == 2 and all(
        m.startswith(f"PIQP's helper process ended with signal {kill} on a QP of {r.x.size} columns and ")
        and m.endswith(" rows; solving it with Clarabel") for m, r in zip(said, crashed.results))
    np.testing.assert_array_equal(solution.hist, reference.hist)
    assert solution.hist.sum() == problem.parent_hist.sum() and (solution.hist >= 0).all()


@pytest.mark.slow
def test_a_parent_solved_longer_than_the_worker_ttl_runs_once(monkeypatch):
    """A parent of 150 children (QPs of 119k columns) on a one-worker cluster whose worker TTL is half its
    longest QP in this process (at least 1 s): the scheduler keeps hearing the worker, the task runs once (one
    transition to processing, no restart), and its result has the bits of the solve in process."""
    problem = dense_parent(0, k=150, people=1_000_000, ncells=252)
    reference = solve_parent(problem, PiqpHighs(isolate_above=None))
    ttl = max(1.0, max(st["qp_s"] for st in reference.stats.l2) / 2)
    # The scheduler keeps at least ten heartbeat intervals (Dask's: 0.5 s, so 5 s): a tenth of the TTL instead.
    monkeypatch.setattr(distributed.scheduler, "heartbeat_interval", lambda n: ttl / 10)
    with dask.config.set({"distributed.scheduler.worker-ttl": f"{ttl}s"}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                         host="127.0.0.1") as cluster, Client(cluster) as client:
        workers = set(client.scheduler_info()["workers"])
        solution = client.submit(solve_parent, problem, BACKENDS["piqp-highs"], key="long-parent").result()
        assert set(client.scheduler_info()["workers"]) == workers  # never restarted
        assert not [e for _, e in client.get_events("scheduler") if e.get("action") == "worker-ttl-timed-out"]
        started = [t for t in cluster.scheduler.story("long-parent") if t[0] == "long-parent" and t[2] == "processing"]
        assert len(started) == 1, started
    qp_s = [st["qp_s"] for st in solution.stats.l2]
    assert min(st["columns"] for st in solution.stats.l2) >= ISOLATE_COLUMNS
    assert max(qp_s) > ttl, (qp_s, ttl)  # the GIL would have been held longer than the TTL
    np.testing.assert_array_equal(solution.hist, reference.hist)
    print(f"solve {solution.stats.total_s:.1f} s, QPs {qp_s} s, worker TTL {ttl:.1f} s")
