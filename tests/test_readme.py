"""Every command of the README and of the documentation's pages works as written, in order, on the bundled data.

The walk reads a document's fenced code blocks top to bottom. A ``bash`` block is run line by line (``\\``
continuations joined) with ``bash -e`` in a scratch directory that sees the repository's ``conf/`` and ``data/``
as a clone does; a block preceded by ``<!-- readme-walk: file NAME -->`` is written to ``NAME`` there (the batch
example's jobs file); a block preceded by ``<!-- readme-walk: skip REASON -->`` is not run, and every other block
must be runnable. The package is already installed where the tests run, so a leading ``pip install ... &&`` is
dropped (installing a wheel here would replace the editable install). README.md and then the documentation's
pages (``docs/``, in the order of the site's tables of contents) are walked one after the other in one scratch
directory, as a reader follows them; a command that has already run there, exactly as written, is not run again
(the site's tutorial repeats the README's first runs, whose outputs the reader already has). Every ``topdown`` command the documents show, run or not, in a
block or inline, names a real command and real flags of the parser.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
_BLOCK = re.compile(r"(?:<!--\s*readme-walk:\s*(?P<verb>skip|file)\s*(?P<arg>[^>]*?)\s*-->\s*\n)?"
                    r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)
_PIP = re.compile(r"^pip install \S+ && ")
_TOCTREE = re.compile(r"^:::\{toctree\}\n(?P<body>.*?)^:::", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    verb: str | None
    arg: str


def blocks(text: str) -> list[Block]:
    return [Block(text.count("\n", 0, m.start("body")) + 1, m["lang"], m["body"], m["verb"], m["arg"] or "")
            for m in _BLOCK.finditer(text)]


def commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comment-only and blank lines dropped, the install
    step in front of a command dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [_PIP.sub("", ln.strip()) for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def doc_pages() -> list[Path]:
    """The documentation's own pages in the order of the site's tables of contents (index.md's, then each
    listed page's own), without the pages that only include a repository file."""
    def walk(page: Path) -> list[Path]:
        out = [page]
        for tree in _TOCTREE.finditer(page.read_text()):
            for name in tree["body"].splitlines():
                if name.strip() and not name.startswith(":"):
                    out += walk((page.parent / f"{name.strip()}.md").resolve())
        return out
    return [p for p in walk(DOCS / "index.md") if not p.read_text().startswith(":::{include}")]


def documents() -> list[Path]:
    return [README, *doc_pages()]


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_every_page_is_in_the_walk():
    """A page the tables of contents do not reach is neither on the site nor walked."""
    walked = set(doc_pages())
    pages = {p.resolve() for p in DOCS.rglob("*.md") if not p.read_text().startswith(":::{include}")}
    assert pages == walked, sorted(map(_name, pages ^ walked))


@pytest.mark.parametrize("doc", documents(), ids=_name)
def test_every_block_is_walked_or_says_why_not(doc: Path):
    """A new example is run by the walk unless it is marked with the reason it cannot be (a placeholder, a
    cluster, a national input)."""
    text = doc.read_text()
    found = blocks(text)
    assert 2 * len(found) == len(re.findall(r"^```", text, re.M)), f"{_name(doc)}: a code fence the walk does not parse"
    for b in found:
        where = f"{_name(doc)} line {b.line}"
        if b.verb == "skip":
            assert b.arg, f"{where}: a skipped block needs its reason"
        elif b.verb == "file":
            assert re.fullmatch(r"[\w.-]+", b.arg), f"{where}: bad file name {b.arg!r}"
        else:
            assert b.lang == "bash", f"{where}: a {b.lang or 'plain'} block is neither run nor marked"
            assert not re.search(r"\b[A-Z]{3,}\b(?![=\w])", " ".join(commands(b.body)).replace("CONFIDENTIAL", "")), (
                f"{where}: a placeholder in a block the walk runs")


def test_the_walks_cover_the_long_jobs():
    walked = [c for doc in documents() for b in blocks(doc.read_text()) if b.verb is None for c in commands(b.body)]
    for command in ("run", "verify", "evaluate", "audit", "reprocess", "batch", "synth", "ingest", "privacy"):
        assert any(c.startswith(f"topdown {command} ") for c in walked), command
    assert any(b.verb == "file" for doc in documents() for b in blocks(doc.read_text()))


# -- every command shown names real flags ------------------------------------------------------------------------

_INLINE = re.compile(r"(?<!`)`(topdown [^`]+)`(?!`)")


def shown_commands(text: str) -> list[str]:
    """Every ``topdown ...`` command line of a document: in its bash blocks (run or not) and inline."""
    out = [c for b in blocks(text) if b.lang == "bash" for c in commands(b.body)]
    out += [m.group(1).replace("\n", " ") for m in _INLINE.finditer(text)]
    return [part.strip() for c in out for part in re.split(r"&&|;|\|", c) if part.strip().startswith("topdown ")]


def unknown_flags(command: str, parsers: dict) -> list[str]:
    """The command's words that are not a command or flag of the parser (``[...]`` and ``...`` are notation)."""
    words = shlex.split(re.sub(r"#.*", "", command).replace("[", " ").replace("]", " "))[1:]
    words = [w for w in words if w != "..."]
    if not words or words[0] in ("--version", "--help", "-h"):
        return []
    top = parsers[None]
    while words and words[0].startswith("-"):
        if words[0] not in top._option_string_actions:
            return [words[0]]
        words = words[1:]
    if not words or words[0] == "COMMAND":  # any command
        return []
    if words[0] not in parsers:
        return words[:1]
    parser = parsers[words[0]]
    return [w for w in words[1:] if w.startswith("--") and w.split("=")[0] not in parser._option_string_actions]


@pytest.fixture(scope="module")
def parsers() -> dict:
    import argparse

    from topdown.pipeline.cli import build_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {None: top, **sub.choices}


@pytest.mark.parametrize("doc", documents(), ids=_name)
def test_every_command_shown_exists(doc: Path, parsers):
    shown = shown_commands(doc.read_text())
    bad = [(c, unknown_flags(c, parsers)) for c in shown if unknown_flags(c, parsers)]
    assert not bad, f"{_name(doc)}: commands or flags the parser does not know: {bad}"


def test_the_check_sees_a_wrong_flag(parsers):
    assert unknown_flags("topdown run demo --out x --wokers 2", parsers) == ["--wokers"]
    assert unknown_flags("topdown runn demo", parsers) == ["runn"]
    assert unknown_flags("topdown run CONFIG --out DIR [--input DIR] [--resume]", parsers) == []
    assert shown_commands("text `topdown verify DIR` and `topdown: error`") == ["topdown verify DIR"]


# -- the walks --------------------------------------------------------------------------------------------------

def walk(docs: list[Path], work: Path) -> list[str]:
    """Runs the documents' blocks in order in ``work``; returns the commands run (a repeat is run once)."""
    work.mkdir()
    for name in ("conf", "data"):
        (work / name).symlink_to(REPO / name)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ran: list[str] = []
    for doc in docs:
        for b in blocks(doc.read_text()):
            if b.verb == "skip":
                continue
            if b.verb == "file":
                (work / b.arg).write_text(b.body)
                continue
            for cmd in commands(b.body):
                if cmd in ran:
                    continue
                done = subprocess.run(["bash", "-e", "-c", cmd], cwd=work, env=env, capture_output=True, text=True,
                                      timeout=1200, stdin=subprocess.DEVNULL)
                where = f"{_name(doc)} line {b.line}"
                assert done.returncode == 0, (f"{where}: `{cmd}` exited {done.returncode}\n"
                                              f"{done.stderr[-3000:]}\n{done.stdout[-2000:]}")
                assert "Traceback" not in done.stderr, f"{where}: `{cmd}`\n{done.stderr[-3000:]}"
                ran.append(cmd)
    return ran
