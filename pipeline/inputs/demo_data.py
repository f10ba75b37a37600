"""Demo input: the 2018 End-to-End Census Test prototype P.L. 94-171 file, Providence County RI (569 blocks).

The four legacy-format files ship gzipped in ``topdown.pipeline.data`` (byte-identical to
data/ri2018_e2e/ before compression; see pipeline/data/README.md) and are ingested with
:func:`topdown.pipeline.inputs.ingest.ingest_pl94_files`, so the block tabulations of the written persons and units
reproduce the published P1, P2, P3, P4, P5 and H1 of every block.

Source: U.S. Census Bureau, 2018 End-to-End Census Test: Prototype P.L. 94-171 Redistricting Data Summary
File (public domain), as subset in the PL94171 R package (c) 2021 Christopher T. Kenny and Cory McCartan, MIT.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from ..runtime.storage import StorePath, location
from .ingest import Summary, ingest_pl94_files

DEMO_FILES = {
    "geo": "rigeo2018_2020Style.pl.gz",
    "seg1": "ri000012018_2020Style.pl.gz",
    "seg2": "ri000022018_2020Style.pl.gz",
    "seg3": "ri000032018_2020Style.pl.gz",
}


def write_demo_input(out: Path | StorePath) -> Summary:
    """Write out/persons.parquet and out/units.parquet from the bundled prototype P.L. 94-171 files."""
    data = files("topdown.pipeline.data")
    src = {key: data.joinpath(name) for key, name in DEMO_FILES.items()}
    return ingest_pl94_files(src["geo"], src["seg1"], src["seg2"], src["seg3"], location(out), command="demo-data")


def demo_baf() -> Path:
    """The 2020 block assignment files of Rhode Island (entities of the demo's blocks: places, county
    subdivisions...): ``data/ri_baf2020`` of a clone, which a wheel installs as ``topdown/data/ri_baf2020``."""
    return Path(__file__).resolve().parents[2] / "data" / "ri_baf2020"
