"""The test kinds read from a test's code (markers.py): a test that runs the ``topdown`` command in a subprocess
is ``cli``; one that starts a process, a cluster or a run is ``system``; the rest are ``unit``."""
from __future__ import annotations

import subprocess

import pytest

from cli_subprocess import topdown
from markers import kind_of_code

pytestmark = pytest.mark.unit  # the functions below only name the CLI and a cluster: a test's own mark wins


def _only_arithmetic():
    return sum(range(3))


def _through_the_cli(tmp):
    return topdown("privacy", "demo", cwd=tmp)


def _calls_a_helper_that_uses_the_cli(tmp):
    return _through_the_cli(tmp).code


def _a_process():
    return subprocess.run(["true"], check=False)


def _a_cluster_inside():
    from distributed import LocalCluster

    return LocalCluster


def _a_pipeline_run(tmp):
    from topdown.pipeline import run

    return run("demo", tmp)


def _the_cli_in_process():
    import topdown.pipeline.cli as cli

    return cli.main(["privacy", "demo"])


def _a_config_load():
    from topdown.pipeline import load_config

    return load_config("demo")


def _in_a_lambda():
    return list(map(lambda t: _through_the_cli(t), []))


@pytest.mark.parametrize("func, kind", [
    (_only_arithmetic, "unit"), (_a_config_load, "unit"),
    (_through_the_cli, "cli"), (_calls_a_helper_that_uses_the_cli, "cli"), (_in_a_lambda, "cli"),
    (_a_process, "system"), (_a_cluster_inside, "system"), (_a_pipeline_run, "system"),
    (_the_cli_in_process, "system"),
])
def test_kind_of_code(func, kind):
    assert kind_of_code([func]) == kind


def test_the_strongest_kind_of_a_test_and_its_fixtures_wins():
    assert kind_of_code([_only_arithmetic, _a_process]) == "system"
    assert kind_of_code([_a_process, _through_the_cli, _only_arithmetic]) == "cli"


def test_this_file_is_marked_unit(request):
    assert request.node.get_closest_marker("unit") and not request.node.get_closest_marker("system")


class _Item:
    """The little of a collected pytest item that ``mark_items`` reads and writes."""

    def __init__(self, func, *marks: str):
        self.function, self.fixturenames, self.marks = func, (), set(marks)

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, mark):
        self.marks.add(mark if isinstance(mark, str) else mark.name)


def test_system_tests_leave_the_default_selection_unless_marked_smoke():
    from markers import mark_items

    unit, system, cli, smoke = (_Item(_only_arithmetic), _Item(_a_pipeline_run), _Item(_through_the_cli),
                                _Item(_a_pipeline_run, "smoke"))
    mark_items([unit, system, cli, smoke])
    assert unit.marks == {"unit"}
    assert system.marks == {"system", "slow"} and cli.marks == {"cli", "system", "slow"}
    assert smoke.marks == {"smoke", "system"}


def test_packages_of_a_virtual_environment_inside_the_clone_are_not_repository_code():
    """The README's commands work with the environment made inside the clone (``.venv``): its packages are
    not read as the test folder's code (their classes once broke the marking of every test)."""
    import types

    from markers import REPO, _file_in_repository, _in_repository

    assert _file_in_repository(str(REPO / "tests" / "conftest.py"))
    assert not _file_in_repository(str(REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "dask" / "base.py"))
    assert not _file_in_repository("/usr/lib/python3/dist-packages/numpy/__init__.py")
    assert not _in_repository(types.FunctionType)  # its __code__ is a descriptor
    assert _in_repository(test_this_file_is_marked_unit)
