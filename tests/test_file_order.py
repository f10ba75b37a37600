"""The order of the slow selection's files under pytest-xdist (file_order.py)."""
from __future__ import annotations

from types import SimpleNamespace

from file_order import DURATIONS, file_seconds, longest_first, record


def _items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_longest_files_first_each_file_in_its_own_order():
    items = _items("tests/test_a.py::x", "tests/test_b.py::y", "tests/test_a.py::z", "tests/test_c.py::w")
    ordered = longest_first(items, {"tests/test_b.py": 300.0, "tests/test_a.py": 5.0})
    assert [i.nodeid for i in ordered] == ["tests/test_b.py::y", "tests/test_a.py::x", "tests/test_a.py::z",
                                          "tests/test_c.py::w"]  # c unmeasured: one second a test


def test_unmeasured_files_weigh_their_test_count_ties_by_name():
    items = _items("tests/test_d.py::a", "tests/test_c.py::a", "tests/test_c.py::b", "tests/test_e.py::a")
    assert [i.nodeid for i in longest_first(items, {})] == ["tests/test_c.py::a", "tests/test_c.py::b",
                                                            "tests/test_d.py::a", "tests/test_e.py::a"]


def test_record_sums_seconds_per_file(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="t1" time="1.25"/>'
                   '<testcase classname="tests.test_a.TestX" name="t2" time="2.5"/>'
                   '<testcase classname="tests.test_b" name="t" time="0.5"/>'
                   '<testcase classname="" name="tests" time="9"/></testsuite></testsuites>')  # names no file
    assert record(xml) == {"tests/test_a.py": 3.8, "tests/test_b.py": 0.5}


def test_the_recorded_durations_name_test_files_that_exist():
    from conftest import REPO

    seconds = file_seconds()
    assert DURATIONS.exists() and seconds
    assert all((REPO / f).is_file() and s >= 0 for f, s in seconds.items())
