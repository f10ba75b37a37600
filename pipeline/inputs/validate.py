"""Read and check the CEF-like input contract (DESIGN.md section 2; facts file sections 1.5, 2.3, 2.4).

persons.parquet: ``geoid`` (15-digit block GEOID), ``hhgq`` 0..7, ``votingage`` 0..1, ``hispanic`` 0..1,
``cenrace`` 0..62. units.parquet: ``geoid``, ``unit_type`` 0..7 (0 housing unit, 1..7 GQ major types in
hhgq order), ``occupied`` (bool; GQ facilities are always occupied).

Besides column-level checks, the block-level structure the TopDown constraints rely on is checked:

* a person of type hhgq=k needs a unit of type k in the block (``hhgq_total_ub``: u_k * cap = 0 otherwise);
* a GQ facility needs at least one resident of its type (``hhgq_total_lb``: persons_k >= u_k, facts 2.3);
* GQ facilities are occupied (facts 2.8);
* no person under 18 in a nursing facility (``nurse_nva_0``, facts 2.4).

Every failure raises :class:`InputError` naming the file, the column, the block GEOID of the first
offending record and the bad value (a code or a GEOID). Messages never contain a count of persons, nor a
record's position in its file: in a file sorted by GEOID a row number is the number of persons (or units)
in the blocks before it, a confidential count; only declared invariants may be disclosed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GEOID_LEN = 15
NURSING = 3

#: Integer columns and their legal closed ranges (facts file 1.5, "Config legal values").
PERSON_CODES: dict[str, tuple[int, int]] = {"hhgq": (0, 7), "votingage": (0, 1), "hispanic": (0, 1), "cenrace": (0, 62)}
UNIT_CODES: dict[str, tuple[int, int]] = {"unit_type": (0, 7)}
PERSON_COLUMNS = ("geoid", *PERSON_CODES)
UNIT_COLUMNS = ("geoid", "unit_type", "occupied")


class InputError(ValueError):
    """The input files break the data contract."""


def _fail(path: Path, column: str, block: str | None, problem: str, value: object = None) -> InputError:
    """The error for the first bad record: its file, column, block GEOID (None: not known) and value."""
    where = f", block {block}" if block is not None else ""
    shown = "" if value is None else f" (value {value!r})"
    return InputError(f"{path}: column '{column}'{where}: {problem}{shown}")


def _block_of(table: pa.Table, row: int) -> str | None:
    """The GEOID of record ``row`` when it is a string, else None."""
    value = table.column("geoid")[row].as_py()
    return value if isinstance(value, str) else None


def _read(path: Path, columns: tuple[str, ...]) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(f"{path}: column '{missing[0]}': required column missing (have {table.column_names})")
    return table.select(list(columns)).combine_chunks()


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_nulls(path: Path, table: pa.Table) -> None:
    for name in table.column_names:
        col = table.column(name)
        if col.null_count:
            row = _first(pc.is_null(col).to_numpy(zero_copy_only=False))
            raise _fail(path, name, _block_of(table, row), "null value", None)


def _geoids(path: Path, table: pa.Table) -> pa.Array:
    col = table.column("geoid")
    if pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type):
        col = col.cast(pa.string())
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_string_view(col.type)):
        value = col[0].as_py() if len(col) else None
        raise _fail(path, "geoid", None, f"wrong type {col.type}, expected a 15-character string", value)
    col = col.cast(pa.string())
    ok = pc.match_substring_regex(col, f"^[0-9]{{{GEOID_LEN}}}$").to_numpy(zero_copy_only=False)
    if not ok.all():
        row = _first(~ok)
        raise _fail(path, "geoid", None, f"malformed GEOID, expected {GEOID_LEN} digits", col[row].as_py())
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _codes(path: Path, table: pa.Table, name: str, lo: int, hi: int) -> np.ndarray:
    col = table.column(name)
    if not pa.types.is_integer(col.type):
        value = col[0].as_py() if len(col) else None
        raise _fail(path, name, None, f"wrong type {col.type}, expected an integer", value)
    values = col.to_numpy()
    bad = (values < lo) | (values > hi)
    if bad.any():
        row = _first(bad)
        raise _fail(path, name, _block_of(table, row), f"code out of range {lo}..{hi}", int(values[row]))
    return values.astype(np.int8)


def _flags(path: Path, table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if pa.types.is_boolean(col.type):
        return col.to_numpy(zero_copy_only=False).astype(bool)
    if pa.types.is_integer(col.type):
        return _codes(path, table, name, 0, 1).astype(bool)
    value = col[0].as_py() if len(col) else None
    raise _fail(path, name, None, f"wrong type {col.type}, expected bool", value)


def _block_codes(person_geoids: pa.Array, unit_geoids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Shared integer codes of the GEOIDs of both files."""
    both = pa.concat_arrays([person_geoids, unit_geoids]).dictionary_encode()
    idx = both.indices.to_numpy().astype(np.int64)
    return idx[: len(person_geoids)], idx[len(person_geoids):]


def _check_blocks(persons_path: Path, units_path: Path, persons: pd.DataFrame, units: pd.DataFrame,
                  pblock: np.ndarray, ublock: np.ndarray) -> None:
    utype = units["unit_type"].to_numpy(np.int64)
    gq = utype > 0
    unoccupied_gq = gq & ~units["occupied"].to_numpy()
    if unoccupied_gq.any():
        row = _first(unoccupied_gq)
        raise _fail(units_path, "occupied", units['geoid'].iat[row], f"GQ facility of type {utype[row]} "
                    "is marked unoccupied (GQ facilities are always occupied)", False)

    hhgq = persons["hhgq"].to_numpy(np.int64)
    nursing_minor = (hhgq == NURSING) & (persons["votingage"].to_numpy() == 0)
    if nursing_minor.any():
        row = _first(nursing_minor)
        raise _fail(persons_path, "votingage", persons['geoid'].iat[row], f"person under 18 in a nursing facility "
                    f"(hhgq {NURSING}; structural zero nurse_nva_0)", 0)

    pkey = pblock * 8 + hhgq
    ukey = ublock * 8 + utype
    unit_keys, first_unit_row, n_units = np.unique(ukey, return_index=True, return_counts=True)
    homeless = ~np.isin(pkey, unit_keys)
    if homeless.any():
        row = _first(homeless)
        kind = "housing unit" if hhgq[row] == 0 else f"GQ facility of type {hhgq[row]}"
        raise _fail(persons_path, "hhgq", persons['geoid'].iat[row], f"the block has no {kind} for this person",
                    int(hhgq[row]))

    residents = np.bincount(np.searchsorted(unit_keys, pkey), minlength=len(unit_keys))
    gq_keys = unit_keys % 8 > 0
    short = gq_keys & (residents < n_units)
    if short.any():
        rows = first_unit_row[short]
        row = int(rows.min())
        raise _fail(units_path, "unit_type", units['geoid'].iat[row], "the block has more GQ facilities of this type "
                    "than residents of that type (each facility needs a resident: hhgq_total_lb)", int(utype[row]))


def validate_input(persons_path: Path | str, units_path: Path | str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read persons.parquet and units.parquet, check the contract, return compact frames in file order.

    Returned dtypes: ``geoid`` str, codes int8, ``occupied`` bool. Raises :class:`InputError`.
    """
    persons_path, units_path = Path(persons_path), Path(units_path)
    ptable = _read(persons_path, PERSON_COLUMNS)
    utable = _read(units_path, UNIT_COLUMNS)
    _check_nulls(persons_path, ptable)
    _check_nulls(units_path, utable)

    pgeo = _geoids(persons_path, ptable)
    ugeo = _geoids(units_path, utable)
    persons = pd.DataFrame({"geoid": pd.Series(pgeo.to_pandas(), dtype="str")})
    for name, (lo, hi) in PERSON_CODES.items():
        persons[name] = _codes(persons_path, ptable, name, lo, hi)
    units = pd.DataFrame({"geoid": pd.Series(ugeo.to_pandas(), dtype="str")})
    units["unit_type"] = _codes(units_path, utable, "unit_type", *UNIT_CODES["unit_type"])
    units["occupied"] = _flags(units_path, utable, "occupied")

    pblock, ublock = _block_codes(pgeo, ugeo)
    _check_blocks(persons_path, units_path, persons, units, pblock, ublock)
    return persons, units
