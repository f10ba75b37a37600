"""No reference outside the repository.

Code, comments, documents and presets cite public sources (the Bureau's GitHub repositories and their paths,
papers and their sections; docs/index.md, "Layout", names the abbreviations), never a private notes file ("facts
2.3"), a numbered private reading list ("seed 003"), a folder beside the clone or the design plan's section
numbers ("DESIGN.md section 2": this repository's DESIGN.md has numbered items, not sections).
"""
from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO

#: What a reference outside the repository looks like (case-insensitive).
OUTSIDE = re.compile(r"\bfacts (?:file )?(?:sections? )?\d|\bfacts file\b|\bseeds? 0\d\d\b|\.\./shared\b"
                     r"|/work/shared\b|\bDESIGN\.md sections? \d", re.IGNORECASE)

SELF = "tests/test_docs.py"  # holds the patterns as examples


def _text_files() -> list[str]:
    """The repository's tracked files (git), or every file outside hidden and build folders without git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
        names = [n for n in out.stdout.decode().split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = []
    if not names:
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                 and not any(part.startswith(".") or part in ("build", "dist", "__pycache__")
                             for part in p.relative_to(REPO).parts)]
    return sorted(names)


def _hits(name: str) -> list[str]:
    path = REPO / name
    if not path.is_file():  # deleted in the work tree, not yet in the index
        return []
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    return [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]


def test_no_reference_outside_the_repository():
    files = [n for n in _text_files() if n != SELF]
    assert len(files) > 50
    found = [hit for n in files for hit in _hits(n)]
    assert not found, "references outside the repository (cite the public source instead):\n" + "\n".join(found)


@pytest.mark.parametrize("text, bad", [
    ("bounds (facts 2.3)", True), ("facts file sections 2.1-2.8", True), ("Facts 4.8: a cell", True),
    ("(seed 003 Table 2)", True), ("seeds 001, 004", True), ("see ../shared/reference", True),
    ("/work/shared/data/ri2010/x.csv", True), ("DESIGN.md section 2", True),
    ("the production preset matches the facts", False), ("--seed 1", False), ("DESIGN.md item 13", False),
    ("Abowd et al. 2022, section 7.5", False), ("/shared/national-input", False),
])
def test_the_pattern(text, bad):
    assert bool(OUTSIDE.search(text)) is bad


def test_benchmarks_index_names_every_file():
    """benchmarks/README.md has a line for every script, configuration and results file of benchmarks/."""
    index = (REPO / "benchmarks" / "README.md").read_text()
    files = [n.split("/", 1)[1] for n in _text_files() if n.startswith("benchmarks/") and n.count("/") == 1]
    assert len(files) > 30
    missing = [f for f in files if f != "README.md" and f"`{f}`" not in index]
    assert not missing, f"benchmarks/README.md does not index {missing}"


def test_every_results_file_is_a_docs_page():
    """Every benchmarks/RESULTS*.md is included by a page of the documentation site."""
    pages = " ".join(p.read_text() for p in (REPO / "docs").rglob("*.md"))
    missing = [p.name for p in sorted((REPO / "benchmarks").glob("RESULTS*.md"))
               if f":::{{include}} ../../benchmarks/{p.name}" not in pages]
    assert not missing, f"results files without a docs page: {missing}"


def test_the_generated_reference_is_complete():
    """Every configuration key has a meaning on the generated page, and every marker names a generator."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    rows = [r for r in generate.configuration_reference().splitlines() if r.startswith("| `")]
    assert len(rows) > 30 and all(not r.endswith("|  |") for r in rows), [r for r in rows if r.endswith("|  |")]
    for page in (REPO / "docs").rglob("*.md"):
        for name in generate.MARKER.findall(page.read_text()):
            assert name in generate.GENERATORS, f"{page.name}: unknown generated section {name}"
    assert "| `[census.hierarchy]` |" in generate.census_reference()
    assert "| 4 | `EXIT_RUNDIR` |" in generate.exit_codes_reference()
    assert "histograms/<product>/level=<L>/" in generate.run_layout_reference()
    assert "## `reprocess`" in generate.cli_reference()


#: A pointer to an issue of the project's tracker, which a reader of the code cannot resolve ("Special Issue 2" of
#: a journal is a citation, not a pointer).
ISSUE = re.compile(r"(?<!Special )\b[Ii]ssues? #?\d+")


def test_no_issue_pointers():
    """Code, tests and documents explain what is, not which issue asked for it (the changelog keeps the history)."""
    files = [n for n in _text_files() if n not in (SELF, "CHANGELOG.md") and n.endswith((".py", ".md", ".toml", ".sh"))]
    found = [f"{n}:{(REPO / n).read_text().count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for n in files if (REPO / n).is_file() for m in ISSUE.finditer((REPO / n).read_text())]
    assert not found, "issue pointers:\n" + "\n".join(found)


@pytest.mark.parametrize("text, bad", [("(issue 30 item 2)", True), ("Issue 19: the bound", True),
                                       ("issues 4", True), ("Special Issue 2", False), ("no issue here", False)])
def test_the_issue_pattern(text, bad):
    assert bool(ISSUE.search(text)) is bad
