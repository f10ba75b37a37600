"""benchmarks/run_stages.py: which stage each poll's CPU and memory are booked to."""
from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import run_stages
finally:
    sys.path.remove(str(REPO / "benchmarks"))


def _sample(tracker: run_stages.StageTracker) -> None:
    with tracker.lock:
        tracker.record()


def test_a_levels_samples_are_its_own_from_its_first_to_its_last_chunk():
    """A poll between a driver stage and a level's first chunk goes to that level, a poll during its chunks
    to it, a poll after its last chunk to the next level that reports (not to the next level from its first
    chunk on, which would give the County level's CPU to the Tract level)."""
    t = run_stages.StageTracker()
    t.set("spine")
    _sample(t)
    t.await_level()
    _sample(t)                                    # before County's first chunk: County's
    t.progress("persons", "County", 1, 3)
    _sample(t)
    t.progress("persons", "County", 2, 3)
    _sample(t)
    t.progress("persons", "County", 3, 3)
    _sample(t)                                    # after County's last chunk: the next level's
    t.progress("persons", "Tract", 1, 2)
    _sample(t)
    t.progress("persons", "Tract", 2, 2)
    t.set("persons.mdf")
    _sample(t)
    assert t.stages == ["spine", "persons.County", "persons.County", "persons.County", "persons.Tract",
                        "persons.Tract", "persons.mdf"]
    assert t.levels["persons.County"]["chunks"] == 3
