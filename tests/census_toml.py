"""A stand-in for the declaration loader (``pipeline/configuration/census.py``, written in parallel) for the
example censuses' tests: reads a ``[census]`` TOML table into the typed objects of ``vocab/census.py``, with
no error checking. Once the loader is merged, tests use :func:`load` only through it (see :func:`load`)."""
from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

from topdown.vocab.census import (Attribute, Census, ConstraintSpec, Hierarchy, InvariantSpec, Level, Product,
                                  Records, UnitBounds, Units)
from topdown.vocab.schema import Schema

CONF = Path(__file__).resolve().parent.parent / "conf" / "census"


def _product(name: str, t: dict) -> Product:
    attributes = tuple(Attribute(a["name"], a["size"], a.get("column", a["name"]),
                                 tuple(a["labels"]) if "labels" in a else None,
                                 tuple((v, k) for v, k in a["values"]) if "values" in a else None)
                       for a in t["attributes"])
    recodes = {r: (spec["attribute"], tuple(tuple(g) for g in spec["groups"]))
               for r, spec in t.get("recodes", {}).items()}
    constraints = {}
    for c, spec in t.get("constraints", {}).items():
        if "zero_where" in spec:
            terms = []
            for attr, levels in spec["zero_where"].items():
                recodes[f"{c}__{attr}"] = (attr, (tuple(levels),))
                terms.append(f"{c}__{attr}")
            constraints[c] = ConstraintSpec(c, " * ".join(terms), "==", "zero")
        else:
            constraints[c] = ConstraintSpec(c, spec["query"], spec["sense"], spec["rhs"])
    schema = Schema(name, tuple((a.name, a.size) for a in attributes), recodes)
    records = t.get("records", name)
    records = (Records(records) if isinstance(records, str)
               else Records(records["name"], tuple((k, tuple(v)) for k, v in records.get("where", {}).items())))
    ub = t.get("unit_bounds")
    return Product(schema, records, attributes,
                   {k: InvariantSpec(k, v) for k, v in t.get("invariants", {}).items()}, constraints,
                   UnitBounds(ub["attribute"], tuple(ub["min_per_unit"]), tuple(ub["cap"])) if ub else None,
                   tuple(t.get("evaluation_queries", ("total", "detailed"))),
                   tuple(t.get("uncertainty_queries", ("total",))), t.get("mdf", "generic"))


def census_from_toml(path: Path) -> Census:
    """The :class:`Census` a declaration file declares (no checks: the loader's job)."""
    c = tomllib.loads(Path(path).read_text())["census"]
    h = c["hierarchy"]
    hierarchy = Hierarchy(tuple(Level(v["name"], v.get("width"), v.get("column")) for v in h["levels"]),
                          h.get("geocode"), h.get("pattern"), h.get("root_code", "US"), h.get("us", False),
                          h.get("state"))
    units = Units(**c["units"]) if "units" in c else None
    products = tuple(_product(name, t) for name, t in c["products"].items())
    return Census(c["name"], hierarchy, products, units, str(path))


def load(name: str) -> Census:
    """A shipped census by name: through the declaration loader when it exists, else :func:`census_from_toml`."""
    if importlib.util.find_spec("topdown.pipeline.configuration.census") is not None:
        from topdown.pipeline.configuration.census import load_census

        return load_census(name)
    return census_from_toml(CONF / f"{name}.toml")
