"""The order in which CI's processes take the slow selection's files: longest first.

``.ci/run`` runs the slow selection with pytest-xdist, one file per process at a time (``--dist loadfile``),
each process taking the next file in the collection's order when it is done with one. Files are put in that
order by their measured seconds (``durations.json``: the slow selection of a clean-clone ``.ci/run``, refreshed
with ``python tests/file_order.py JUNIT.xml`` from a run's ``--junitxml``), longest first, so that no long file
starts last while the other processes are idle (the longest-processing-time rule). A file not measured yet counts one second a test. The order
changes no test's outcome: every file stands alone.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def file_seconds() -> dict[str, float]:
    """Measured seconds of each test file (path relative to the repository), or {} when none is recorded."""
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """The items, their files ordered by measured seconds (longest first), each file's tests in their order."""
    by_file: dict[str, list] = defaultdict(list)
    for item in items:
        by_file[item.nodeid.split("::", 1)[0]].append(item)
    order = sorted(by_file, key=lambda f: (-seconds.get(f, float(len(by_file[f]))), f))
    return [item for f in order for item in by_file[f]]


class LongestFirst:
    """The plugin a pytest-xdist process registers (conftest.py): its collection, whose order the controller
    hands out file by file, longest first. Last of the collection hooks, after pytest has grouped the tests by
    their fixtures' scopes (which would undo the order)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list) -> None:
        items[:] = longest_first(items, file_seconds())


def record(junit_xml: Path) -> dict[str, float]:
    """Seconds per test file in a pytest ``--junitxml`` report."""
    import xml.etree.ElementTree as ET

    out: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).iter("testcase"):
        module = case.get("classname", "").split(".")
        test_module = next((i for i, part in enumerate(module) if part.startswith("test_")), None)
        if test_module is None:  # a report that names no test file (a collection error, say)
            continue
        out["/".join(module[:test_module + 1]) + ".py"] += float(case.get("time", 0))  # tests.test_x.Class
    return {f: round(s, 1) for f, s in sorted(out.items())}


if __name__ == "__main__":
    DURATIONS.write_text(json.dumps(record(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {DURATIONS}")
