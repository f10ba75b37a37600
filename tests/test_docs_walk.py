"""The README's and the documentation site's commands run as written, the README first and then the site page by
page in its order, in one fresh folder (tests/test_readme.py: the walk's rules). Its own file: the longest test (a
Rhode Island run, its evaluation, an audit, reprocessing), which the slow selection's processes run beside the other
files."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_readme import README, commands, blocks, doc_pages, walk


@pytest.mark.slow
def test_readme_then_docs_commands_work_as_written_in_order(tmp_path: Path):
    docs = [README, *doc_pages()]
    ran = walk(docs, tmp_path / "clone")
    shown = {c for doc in docs for b in blocks(doc.read_text()) if b.verb is None and b.lang == "bash"
             for c in commands(b.body)}
    assert set(ran) == shown and len(ran) == len(shown)
