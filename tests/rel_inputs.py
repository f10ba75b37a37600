"""A small synthetic input with planted, distinctive confidential counts, for the reliability,
bad-input and confidentiality tests.

Geography: state 44, county 007, two tracts, three block groups, six blocks. Planted true counts
(``SECRETS``) are block, block-group and tract counts that are *not* declared invariants; the
declared invariants (``INVARIANTS``: block housing-unit and GQ counts, the state total) may be
disclosed.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Collection

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

#: (geoid, hhgq, votingage, hispanic, cenrace) -> number of persons.
PERSON_CELLS: dict[tuple[str, int, int, int, int], int] = {
    ("440070001001001", 0, 1, 0, 0): 4321,   # one cell of one block holds 4,321 persons
    ("440070001001001", 0, 0, 0, 0): 12,
    ("440070001001002", 0, 1, 1, 5): 2718,
    ("440070001001002", 0, 1, 0, 1): 30,
    ("440070001002003", 0, 1, 0, 0): 40,
    ("440070001002003", 0, 0, 1, 7): 17,
    ("440070002001001", 0, 0, 0, 2): 1357,
    ("440070002001001", 5, 1, 0, 0): 6,
    ("440070002001003", 3, 1, 0, 0): 9,
}

#: (geoid, unit_type, occupied) -> number of units (declared invariants at the block level).
UNIT_ROWS: dict[tuple[str, int, bool], int] = {
    ("440070001001001", 0, True): 1700,
    ("440070001001001", 0, False): 40,
    ("440070001001002", 0, True): 1100,
    ("440070001002003", 0, True): 25,
    ("440070002001001", 0, True): 600,
    ("440070002001001", 5, True): 1,
    ("440070002001002", 0, False): 4,
    ("440070002001003", 3, True): 1,
}

#: Confidential numbers that must never appear in a log line or message: planted cells, block
#: totals (4333, 2748, 1363), block-group and tract totals (7081, 7138, 1372).
SECRETS = (4321, 4333, 2718, 2748, 1357, 1363, 7081, 7138, 1372)
#: The declared-public state (and US) total.
STATE_TOTAL = sum(PERSON_CELLS.values())


def persons_frame() -> pd.DataFrame:
    rows = [key for key, n in PERSON_CELLS.items() for _ in range(n)]
    df = pd.DataFrame(rows, columns=["geoid", "hhgq", "votingage", "hispanic", "cenrace"])
    return df.astype({c: "int64" for c in ("hhgq", "votingage", "hispanic", "cenrace")})


def units_frame() -> pd.DataFrame:
    rows = [key for key, n in UNIT_ROWS.items() for _ in range(n)]
    return pd.DataFrame(rows, columns=["geoid", "unit_type", "occupied"]).astype({"unit_type": "int64"})


def write_planted_input(path: Path, persons: pd.DataFrame | None = None, units: pd.DataFrame | None = None) -> Path:
    """Write persons.parquet and units.parquet (the planted input, or the frames given) into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    (persons_frame() if persons is None else persons).to_parquet(path / "persons.parquet", index=False)
    (units_frame() if units is None else units).to_parquet(path / "units.parquet", index=False)
    return path


#: A whole number (optionally with thousands separators; "4321.0" counts) that is not either part of a
#: decimal with a fractional part ("478.73" is no count), part of a longer number or of a word (a
#: hexadecimal digest), or a term of a fraction such as a budget share "2748/8407049".
_NUMBER = re.compile(r"(?<![\w./])(\d{1,3}(?:,\d{3})+|\d+)(?![\w/]|,\d{3}|\.\d*[1-9])")
#: Identifiers that are not counts though they may hold a run of digits: SHA-256 digests (manifest,
#: certificate) and UUIDs (Dask's worker and client ids in a DEBUG log, e.g. "Worker-203e95c3-99ee-4333-...").
_NOT_COUNTS = re.compile(r"\b[0-9a-f]{64}\b|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
#: A Dask heartbeat at DEBUG (``-v``): the worker's system metrics (memory and network bytes, seconds, numbers of
#: tasks and open files), none of them the data's; a metric equal to a planted count by chance is no disclosure
#: (seen once in CI: a value of 1357 in such a line).
_HEARTBEAT = "'op': 'heartbeat_worker'"


def leaked_secrets(text: str, secrets: Collection[int] = SECRETS) -> list[tuple[int, str]]:
    """(secret, line) for every line of ``text`` that shows a confidential number (default: the planted ones)."""
    hits = []
    for line in text.splitlines():
        if _HEARTBEAT in line:
            continue
        for m in _NUMBER.finditer(_NOT_COUNTS.sub("", line)):
            value = int(m.group(1).replace(",", ""))
            if value in secrets:
                hits.append((value, line))
    return hits


#: The protected outputs of a run directory: noisy measurements and what is estimated from them (DP).
PROTECTED = ("histograms", "noisy_measurements", "mdf")


def scan_run_dir(run_dir: Path, secrets: Collection[int], strip: str = "",
                 checked: dict[str, Collection[str]] | None = None) -> tuple[list[str], list[str]]:
    """Every file of a run directory outside the protected outputs, scanned for the numbers ``secrets``:
    text files line by line (``strip`` removed first, e.g. the temporary root of the paths they name),
    Parquet files value by value (numeric columns by equality, string columns and the schema metadata as
    text). ``checked`` names numeric columns (file -> columns) the caller has compared with independently
    computed invariants: a chance equality there is no finding. Returns (findings, the files scanned as
    "path (what)")."""
    checked = checked or {}
    findings, scanned = [], []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = str(path.relative_to(run_dir))
        if rel.split("/")[0] in PROTECTED:
            continue
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            meta = "\n".join(v.decode(errors="replace") for v in (table.schema.metadata or {}).values())
            findings += [f"{rel} metadata: {line}" for _, line in leaked_secrets(meta, secrets)]
            for name in table.column_names:
                values = table.column(name).to_pandas().dropna()
                if values.dtype.kind in "iuf":
                    if name in checked.get(rel, ()):
                        continue
                    hits = sorted(set(values[values == values.round()].astype(np.int64)) & set(secrets))
                    findings += [f"{rel} column {name}: {v}" for v in hits]
                else:
                    text = "\n".join(values.astype(str).unique())
                    findings += [f"{rel} column {name}: {line}" for _, line in leaked_secrets(text, secrets)]
            scanned.append(f"{rel} (Parquet, {table.num_rows} rows, columns {', '.join(table.column_names)})")
        else:
            text = path.read_text(errors="replace").replace(strip, "<tmp>") if strip else path.read_text(errors="replace")
            findings += [f"{rel}: {line}" for _, line in leaked_secrets(text, secrets)]
            scanned.append(f"{rel} (text, {len(text.splitlines())} lines)")
    return findings, scanned


def no_partial_output(run_dir: Path) -> list[str]:
    """What a failed run left behind that it must not have (empty list: nothing)."""
    import json

    bad = [name for name in ("histograms", "noisy_measurements", "mdf", "invariants", "spine.parquet",
                             "certificate.json", "config.json") if (run_dir / name).exists()]
    manifest = run_dir / "manifest.json"
    if manifest.exists():
        bad.append(f"manifest.json (status {json.loads(manifest.read_text()).get('status')})")
    if (run_dir / ".lock").exists():
        bad.append(".lock")
    return bad


DATA_OUTPUTS = ("histograms", "noisy_measurements", "mdf", "invariants", "spine.parquet")


def data_files(run_dir: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every Parquet data output of a run directory."""
    files: dict[str, bytes] = {}
    for name in DATA_OUTPUTS:
        top = run_dir / name
        paths = [top] if top.is_file() else sorted(top.rglob("*.parquet"))
        for path in paths:
            files[str(path.relative_to(run_dir))] = path.read_bytes()
    return files


def differing_outputs(a: Path, b: Path) -> list[str]:
    """Data files that are missing from one run directory or differ byte for byte (empty: identical)."""
    fa, fb = data_files(a), data_files(b)
    assert fa, f"{a} has no data outputs"
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
