"""The documentation site's commands run as written, page by page in the site's order, in a fresh folder (the
README walk's rule, tests/test_readme.py). Its own file: the longest walk (a Rhode Island run, its evaluation
and reprocessing), which the slow selection's processes then run beside the other files."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_readme import doc_pages, walk


@pytest.mark.slow
def test_docs_commands_work_as_written_in_order(tmp_path: Path):
    walk(doc_pages(), tmp_path / "clone")
