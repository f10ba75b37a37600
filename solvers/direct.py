"""Direct numpy/scipy build of the same StandardForm as the Pyomo model: what production runs compile
(``solve.DEFAULT_COMPILER``), checked equal to the Pyomo model's compilation in the tests."""
from __future__ import annotations

from .layout import Layout
from .standard import FAMILIES, StandardForm, stack_families


def compile_direct(layout: Layout) -> StandardForm:
    """Stack the layout's row families into one CSR matrix."""
    return stack_families(layout, [layout.families[name].csr() for name in FAMILIES])
