"""The adversarial catalogue (tests/adversarial_catalogue.py) counted by class and outcome, as a Markdown table.

    python tests/adversarial_tally.py [JUNIT.xml]

Without a report, the outcomes are the catalogue's own: passes, a bug it found (fixed in the code), or a problem
still open (xfail, with its reason). With the JUnit XML of a pytest run of tests/test_adversarial_catalogue.py
(``--junitxml``), each case's outcome is that run's instead (a case that failed, or was not run, says so).
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from adversarial_catalogue import CLASSES, Case, catalogue, sample  # noqa: E402

OUTCOMES = ("passed", "bug found, fixed", "open (xfail)", "failed", "not run")


def _expected(case: Case) -> str:
    return "open (xfail)" if case.xfail else "bug found, fixed" if case.fixed else "passed"


def _reported(path: Path) -> dict[str, str]:
    """Each case id's outcome in a JUnit report: passed, failed, xfailed or skipped."""
    found = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = tc.get("name", "")
        if not name.startswith("test_case["):
            continue
        kids = {child.tag for child in tc}
        skipped = tc.find("skipped")
        if "failure" in kids or "error" in kids:
            found[name[len("test_case["):-1]] = "failed"
        elif skipped is not None:
            found[name[len("test_case["):-1]] = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            found[name[len("test_case["):-1]] = "passed"
    return found


def outcome(case: Case, reported: dict[str, str] | None) -> str:
    if reported is None:
        return _expected(case)
    got = reported.get(case.id)
    if got in (None, "skipped"):
        return "not run"
    if got == "failed":
        return "failed"
    return _expected(case)


def tally(cases: list[Case], reported: dict[str, str] | None = None) -> str:
    by_class = Counter((c.klass, outcome(c, reported)) for c in cases)
    shown = [o for o in OUTCOMES if any(by_class[(k, o)] for k in CLASSES)]
    lines = ["| class | " + " | ".join(shown) + " | cases |", "|---" * (len(shown) + 2) + "|"]
    for klass in CLASSES:
        row = [by_class[(klass, o)] for o in shown]
        lines.append(f"| {klass} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    totals = [sum(by_class[(k, o)] for k in CLASSES) for o in shown]
    lines.append("| **all** | " + " | ".join(map(str, totals)) + f" | {sum(totals)} |")
    targets = Counter(c.target.split("/")[0] for c in cases)
    chile = sum("chile" in c.target or "{c" in " ".join(c.argv) for c in cases)
    lines += ["", "Cases by target: " + ", ".join(f"{t} {n}" for t, n in sorted(targets.items())) + ".",
              f"On the Chilean census (chile_2017): {chile}. In the default selection (every 32nd): "
              f"{len(sample(cases))}; the others are `slow`."]
    for title, attr in (("Bugs found and fixed", "fixed"), ("Open (xfail)", "xfail")):
        notes = [f"- `{c.id}`: {getattr(c, attr)}" for c in cases if getattr(c, attr)]
        if notes:
            lines += ["", f"{title}:", *notes]
    return "\n".join(lines)


if __name__ == "__main__":
    print(tally(catalogue(), _reported(Path(sys.argv[1])) if len(sys.argv) > 1 else None))
