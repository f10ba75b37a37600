"""Every README command works as written, in order, on the bundled data (issue 32 item 4).

The walk reads README.md's fenced code blocks top to bottom. A ``bash`` block is run line by line (``\\``
continuations joined) with ``bash -e`` in a scratch directory that sees the repository's ``conf/`` and ``data/``
as a clone does; a block preceded by ``<!-- readme-walk: file NAME -->`` is written to ``NAME`` there (the batch
example's jobs file); a block preceded by ``<!-- readme-walk: skip REASON -->`` is not run, and every other block
must be runnable. The package is already installed where the tests run, so a leading ``pip install ... &&`` is
dropped (installing a wheel here would replace the editable install).
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
_BLOCK = re.compile(r"(?:<!--\s*readme-walk:\s*(?P<verb>skip|file)\s*(?P<arg>[^>]*?)\s*-->\s*\n)?"
                    r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)
_PIP = re.compile(r"^pip install \S+ && ")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    verb: str | None
    arg: str


def blocks(text: str) -> list[Block]:
    return [Block(text.count("\n", 0, m.start("body")) + 1, m["lang"], m["body"], m["verb"], m["arg"])
            for m in _BLOCK.finditer(text)]


def commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comment-only and blank lines dropped, the install
    step in front of a command dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [_PIP.sub("", ln.strip()) for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_every_readme_block_is_walked_or_says_why_not():
    """A new example is run by the walk unless it is marked with the reason it cannot be (a placeholder, a
    cluster, a national input)."""
    text = README.read_text()
    found = blocks(text)
    assert 2 * len(found) == len(re.findall(r"^```", text, re.M)), "a code fence the walk does not parse"
    for b in found:
        if b.verb == "skip":
            assert b.arg, f"README.md line {b.line}: a skipped block needs its reason"
        elif b.verb == "file":
            assert re.fullmatch(r"[\w.-]+", b.arg), f"README.md line {b.line}: bad file name {b.arg!r}"
        else:
            assert b.lang == "bash", f"README.md line {b.line}: a {b.lang or 'plain'} block is neither run nor marked"
            assert not re.search(r"\b[A-Z]{3,}\b(?![=\w])", " ".join(commands(b.body)).replace("CONFIDENTIAL", "")), (
                f"README.md line {b.line}: a placeholder in a block the walk runs")
    walked = [c for b in found if b.verb is None for c in commands(b.body)]
    assert any(c.startswith("topdown batch ") for c in walked) and any(b.verb == "file" for b in found)


@pytest.mark.slow
def test_readme_commands_work_as_written_in_order(tmp_path: Path):
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("conf", "data"):
        (work / name).symlink_to(REPO / name)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for b in blocks(README.read_text()):
        if b.verb == "skip":
            continue
        if b.verb == "file":
            (work / b.arg).write_text(b.body)
            continue
        for cmd in commands(b.body):
            done = subprocess.run(["bash", "-e", "-c", cmd], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=1200, stdin=subprocess.DEVNULL)
            assert done.returncode == 0, (f"README.md line {b.line}: `{cmd}` exited {done.returncode}\n"
                                          f"{done.stderr[-3000:]}\n{done.stdout[-2000:]}")
            assert "Traceback" not in done.stderr, f"README.md line {b.line}: `{cmd}`\n{done.stderr[-3000:]}"
