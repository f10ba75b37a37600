"""Census block assignment files (BAFs) and the entity codes the spine needs (the Bureau's production code,
GitHub uscensusbureau/DAS_2020_Redistricting_Production_Code ("DAS-2020"): `source/etc/AIANNHCE_ranges.csv`,
`source/programs/geographic_spines/define_spines.py`, `geocode_mapping`).

A BAF is pipe-delimited with a header row, one row per tabulation block keyed by ``BLOCKID`` (the
15-character block GEOID), e.g. ``BlockAssign_ST44_RI_MCD.txt`` with ``BLOCKID|COUNTYFP|COUSUBFP``. An
empty field means "not in any such area". Every column is read as a string.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import DAMAGED_FILE_ERRORS, GeographyError, one_line

BAF_NAME = re.compile(r"^BlockAssign_ST(\d{2})_([A-Z]{2})_(.+)\.txt(?:\.gz)?$")

# Known files: entity name -> {BAF column: our column}. Files not listed here keep every column,
# named "<entity>_<column>" in lower case.
KNOWN_COLUMNS: dict[str, dict[str, str]] = {
    "AIANNH": {"AIANNHCE": "aiannhce", "COMPTYP": "comptyp"},
    "INCPLACE_CDP": {"PLACEFP": "placefp"},
    "MCD": {"COUNTYFP": "countyfp", "COUSUBFP": "cousubfp"},
    "CD": {"DISTRICT": "cd"},
    "VTD": {"COUNTYFP": "vtd_countyfp", "DISTRICT": "vtd_district"},
}

# Strong-MCD states (DAS-2020 `source/programs/reader/table_reader.py` default): CT ME MA MI MN NH NJ NY PA RI VT WI.
STRONG_MCD_STATES = frozenset({"09", "23", "25", "26", "27", "33", "34", "36", "42", "44", "50", "55"})

# Included AIANNHCE ranges (DAS-2020 `source/etc/AIANNHCE_ranges.csv`, production `aian_areas`), inclusive.
AIAN_RANGES = ((1, 4799), (4800, 4989), (5000, 5499), (5500, 5899), (5900, 5999), (6000, 7999), (9000, 9499))
FORBIDDEN_AIAN = (4990, 4999)
NOT_AIAN = "9999"


def _read_one(path: Path, entity: str) -> pd.DataFrame:
    """One BAF as a frame indexed by geoid with our column names."""
    try:
        frame = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False, na_values=[])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, *DAMAGED_FILE_ERRORS) as exc:
        raise GeographyError(f"{path}: not a readable block assignment file ({one_line(exc)})") from None
    if "BLOCKID" not in frame.columns:
        raise GeographyError(f"{path}: no BLOCKID column in the header {list(frame.columns)}")
    if frame.empty:
        raise GeographyError(f"{path}: no blocks (a header without rows)")
    bad = frame.loc[~frame["BLOCKID"].str.fullmatch(r"\d{15}"), "BLOCKID"]
    if len(bad):
        raise GeographyError(f"{path}: row {bad.index[0] + 2} has BLOCKID {bad.iloc[0]!r}, not 15 digits")
    known = KNOWN_COLUMNS.get(entity)
    if known is not None:
        missing = [c for c in known if c not in frame.columns]
        if missing:
            raise GeographyError(f"{path}: expected columns {missing} for a {entity} file")
        frame = frame.rename(columns=known)[["BLOCKID", *known.values()]]
    else:
        frame = frame.rename(columns={c: f"{entity}_{c}".lower() for c in frame.columns if c != "BLOCKID"})
    return frame.rename(columns={"BLOCKID": "geoid"}).set_index("geoid")


def read_baf_dir(directory: Path | str) -> pd.DataFrame:
    """All BAFs in ``directory`` (one or more states) joined into one frame indexed by ``geoid``.

    Columns: ``aiannhce, comptyp, placefp, countyfp, cousubfp, cd, vtd`` (``vtd`` = county FIPS +
    district, unique within a state) for the files present, and ``<entity>_<column>`` for any other
    file. A block absent from one entity's file gets "" there (not in any such area). The files of one
    state (by the STxx of their names) are joined at a time: the join's hash tables hold a state's blocks.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"BAF directory {directory} does not exist")
    by_state: dict[str, dict[str, list[Path]]] = {}
    entities: list[str] = []
    for path in sorted(directory.iterdir()):
        match = BAF_NAME.match(path.name)
        if match:
            by_state.setdefault(match.group(1), {}).setdefault(match.group(3), []).append(path)
            entities += [] if match.group(3) in entities else [match.group(3)]
    if not entities:
        raise FileNotFoundError(f"no block assignment files (BlockAssign_STxx_XX_<ENTITY>.txt) in {directory}")
    parts, columns = [], {e: {} for e in entities}  # each entity's columns, in the order first read
    for group in by_state.values():
        frames = {e: [_read_one(p, e) for p in files] for e, files in group.items()}
        for e, read in frames.items():
            columns[e].update(dict.fromkeys(c for frame in read for c in frame.columns))
        parts.append(_joined(directory, frames))
    order = [c for e in entities for c in columns[e]]
    baf = pd.concat([part.reindex(columns=order, fill_value="") for part in parts]) if len(parts) > 1 else parts[0]
    if not _strictly_increasing(baf.index):  # a block in the files of two states: join them all at once
        baf = _joined(directory, {e: [_read_one(p, e) for g in by_state.values() for p in g.get(e, [])]
                                  for e in entities})
    if "vtd_district" in baf.columns:
        county = baf["vtd_countyfp"]
        baf["vtd"] = (county + baf["vtd_district"]).where(baf["vtd_district"] != "", "")
        baf = baf.drop(columns=["vtd_countyfp", "vtd_district"])
    baf.index.name = "geoid"
    baf.attrs["other_files"] = {entity.lower(): [c for c in baf.columns if c.startswith(f"{entity.lower()}_")]
                                for entity in entities if entity not in KNOWN_COLUMNS}
    return baf


def _joined(directory: Path, per_entity: dict[str, list[pd.DataFrame]]) -> pd.DataFrame:
    """The frames of each entity's files joined into one frame by block (sorted; "" where an entity's files
    lack a block); a block twice in one entity's files is an error."""
    frames = []
    for entity, parts in per_entity.items():
        frame = pd.concat(parts)
        dup = frame.index[frame.index.duplicated()]
        if len(dup):
            raise GeographyError(f"{directory}: block {dup[0]} appears twice in the {entity} files")
        frames.append(frame)
    return pd.concat(frames, axis=1, join="outer").fillna("").sort_index()


def _strictly_increasing(index: pd.Index) -> bool:
    """Whether each block GEOID is greater than the one before (sorted, none twice), compared in Arrow."""
    values = pa.chunked_array([pa.array(index.array)]).combine_chunks()
    return len(values) < 2 or not pc.any(pc.less_equal(values[1:], values[:-1])).as_py()


def aian_flags(aiannhce: pd.Series) -> pd.Series:
    """True where the AIANNHCE code is in an included AIAN range (`AIAN_RANGES`); blank or 9999 is False.

    Raises on codes 4990-4999 (asserted absent in production) and on codes that are not 4 digits.
    """
    codes = aiannhce.fillna("").astype(str)
    present = codes != ""
    bad = codes[present & ~codes.str.fullmatch(r"\d{4}")]
    if len(bad):
        raise GeographyError(f"AIANNHCE {bad.iloc[0]!r} (block {bad.index[0]}) is not a 4-digit code")
    numbers = pd.to_numeric(codes.where(present, NOT_AIAN)).astype("int64")
    forbidden = numbers[(numbers >= FORBIDDEN_AIAN[0]) & (numbers <= FORBIDDEN_AIAN[1])]
    if len(forbidden):
        raise GeographyError(f"AIANNHCE {forbidden.iloc[0]:04d} (block {forbidden.index[0]}) is in the "
                             f"forbidden range 4990-4999")
    flag = pd.Series(False, index=codes.index)
    for low, high in AIAN_RANGES:
        flag |= (numbers >= low) & (numbers <= high)
    return flag.rename("aian")


def aian_area(baf: pd.DataFrame) -> pd.Series:
    """DAS AIAN area code per block: AIANNHCE inside an included area, else "9999" (DAS-2020 `define_spines.py`)."""
    return baf["aiannhce"].where(aian_flags(baf["aiannhce"]), NOT_AIAN).rename("aian_area")


def places(baf: pd.DataFrame) -> pd.Series:
    """Place (incorporated place or CDP) per block: "P" + state + PLACEFP, "" outside any place."""
    return _coded("P", baf, baf["placefp"], baf["placefp"] == "", "place")


def mcds(baf: pd.DataFrame) -> pd.Series:
    """MCD per block: "M" + state + county + COUSUBFP, "" where COUSUBFP is blank or 00000 (not defined)."""
    return _coded("M", baf, baf["countyfp"] + baf["cousubfp"], baf["cousubfp"].isin(["", "00000"]), "mcd")


def place_mcd_entity(baf: pd.DataFrame, state: str | pd.Series | None = None,
                     strong_mcd_states: frozenset[str] = STRONG_MCD_STATES) -> pd.Series:
    """The targeted place/MCD entity per block (DAS-2020 `define_spines.py`, `geocode_mapping`;
Abowd et al. 2022, section 7.5).

    In a strong-MCD state and outside AIAN areas: the MCD (see ``mcds``); elsewhere the place (see
    ``places``). ``state`` (2-digit FIPS, one for all blocks or one per block) defaults to the first two
    characters of the geoid index.
    """
    missing = [c for c in ("placefp", "countyfp", "cousubfp", "aiannhce") if c not in baf.columns]
    if missing:
        raise GeographyError(f"place_mcd_entity needs BAF columns {missing} (INCPLACE_CDP, MCD, AIANNH files)")
    if state is None:
        state = pd.Series(baf.index.str[:2], index=baf.index)
    elif isinstance(state, str):
        state = pd.Series(state, index=baf.index)
    use_mcd = state.isin(strong_mcd_states) & ~aian_flags(baf["aiannhce"])
    return mcds(baf).where(use_mcd, places(baf)).rename("place_mcd")


def target_entities(baf: pd.DataFrame) -> pd.DataFrame:
    """The production off-spine entities per block: place/MCD code and DAS AIAN area (DAS-2020 `define_spines.py`,
`call_opt_spine`)."""
    return pd.concat([place_mcd_entity(baf), aian_area(baf)], axis=1)


def _coded(prefix: str, baf: pd.DataFrame, code: pd.Series, blank: pd.Series, kind: str) -> pd.Series:
    """An entity code per block: ``prefix`` + state + ``code``, "" where ``blank`` (not in any such entity)."""
    state = pd.Series(baf.index.str[:2], index=baf.index)
    return (prefix + state + code).where(~blank, "").rename(kind)


def baf_entities(baf: pd.DataFrame) -> list[tuple[str, pd.Series]]:
    """Every kind of entity the block assignment files give, as (kind, entity code per block, "" outside any):
    place, mcd and place_mcd (INCPLACE_CDP, MCD and AIANNH files), cd, vtd, aiannh, and one kind per other file
    (its columns joined, e.g. ``sldl``)."""
    found: list[tuple[str, pd.Series]] = []
    if "placefp" in baf.columns:
        found.append(("place", places(baf)))
    if "cousubfp" in baf.columns:
        found.append(("mcd", mcds(baf)))
    if {"placefp", "cousubfp", "aiannhce"} <= set(baf.columns):
        found.append(("place_mcd", place_mcd_entity(baf)))
    if "cd" in baf.columns:
        found.append(("cd", _coded("D", baf, baf["cd"], baf["cd"].isin(["", "ZZ"]), "cd")))
    if "vtd" in baf.columns:
        found.append(("vtd", _coded("V", baf, baf["vtd"], (baf["vtd"] == "") | baf["vtd"].str.contains("ZZZZ"), "vtd")))
    if "aiannhce" in baf.columns:
        found.append(("aiannh", _coded("A", baf, baf["aiannhce"], baf["aiannhce"].isin(["", NOT_AIAN]), "aiannh")))
    for kind, columns in sorted(baf.attrs.get("other_files", {}).items()):
        parts = baf[columns]
        found.append((kind, _coded("X", baf, parts.agg("|".join, axis=1), (parts == "").all(axis=1), kind)))
    return found
