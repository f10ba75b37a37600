"""The privacy certificate of a run: exact budgets per product, level and query, and (epsilon, delta).

``certificate(config)`` is a JSON-ready dict (written as ``certificate.json``); ``render_certificate``
prints it as text tables. Exact quantities are fraction strings ("p/q"); floats are for reading only.
The composition argument is Abowd et al. 2022 ("The 2020 Census Disclosure Avoidance System TopDown
Algorithm"), Appendix B, Theorem 2: per-query proportions of every level sum to 1
(checked by :func:`check_budget`) and the node shares on every block's path sum to 1
(:func:`check_path_condition`, for spines that move budget between levels by bypassing).
"""
from __future__ import annotations

import math
import sys
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

from .accounting import allocate, check_budget, check_noise, composed_budget
from .budget import NEIGHBOURS, RELEASE_CEILING, Rho, compose, of_config, of_entry, zcdp_to_epsilon_bun_steinke
from ..configuration.config import INFINITE, Config, ConfigError, ProductConfig
from ..runtime.outdir import MARKER_KEY, claimed_file
from ..runtime.rundir import SCHEMA_VERSION, write_json_atomic
from topdown.vocab.census import Product

#: The deltas of the reported epsilon-delta curve.
CURVE_DELTAS = tuple(10.0 ** -k for k in range(6, 15))

PathShares = Mapping[str, Mapping[str, Fraction]]


def check_path_condition(path_shares: PathShares, levels: list[str] | None = None) -> dict[str, Any]:
    """Check Theorem 2's condition 4: for every block, the budget shares c_ij of the nodes on its path
    (one per level, block included) are non-negative and sum to exactly 1.

    ``path_shares`` maps a block geocode to ``{level: share of that block's node at that level}``; with
    ``levels`` given, every block must list exactly those levels. Raises :class:`ConfigError` naming the
    first offending block; returns a summary (number of blocks, min and max share per level as strings).
    """
    lo: dict[str, Fraction] = {}
    hi: dict[str, Fraction] = {}
    distinct = getattr(path_shares, "distinct", None)  # each distinct path once, at its first block
    leaf = levels[-1] if levels else "leaf"
    for block, shares in (distinct() if distinct is not None else path_shares).items():
        if levels is not None and set(shares) != set(levels):
            raise ConfigError(f"path condition: {leaf} {block} has shares for levels {sorted(shares)}, expected {levels}")
        for level, share in shares.items():
            share = Fraction(share)
            if share < 0:
                raise ConfigError(f"path condition: {leaf} {block}, level {level}: negative share {share}")
            lo[level] = min(lo.get(level, share), share)
            hi[level] = max(hi.get(level, share), share)
        total = sum((Fraction(s) for s in shares.values()), Fraction(0))
        if total != 1:
            raise ConfigError(f"path condition: the shares on {leaf} {block}'s path sum to {total}, not 1")
    return {"blocks": len(path_shares), "holds": True,
            "min_share": {k: str(v) for k, v in lo.items()}, "max_share": {k: str(v) for k, v in hi.items()}}


def _product_certificate(spec: Product, product: ProductConfig, path_shares: PathShares | None,
                         source: str) -> dict[str, Any]:
    name, budget = spec.name, product.budget
    levels = list(budget.levels)
    check_budget(budget, levels, spec.schema, where=f"{source}: {name}.budget")
    total = of_config(budget)
    level_rows, query_rows = [], []
    for level in levels:
        level_rows.append({"level": level, "share": str(budget.levels[level]),
                           total.key: str(total * budget.levels[level])})
        for query in budget.queries[level]:
            a = allocate(budget, level, query)
            query_rows.append({"level": level, "query": query, "share": str(a.share),
                               **a.budget.parameters(NEIGHBOURS), "variance": a.variance})
    cert: dict[str, Any] = {
        "product": name,
        "mechanism": total.mechanism,
        "framework": total.framework + ", " + NEIGHBOURS.description,
        "levels": level_rows,
        "queries": query_rows,
        "queries_note": "per-query values for a node holding its level's share; a node whose share was moved "
                        "by bypassing has rho scaled by (its share / the level's share)",
        "path_condition": (check_path_condition(path_shares, levels) if path_shares is not None
                           else {"holds": True, "note": "every node has its level's share; level shares sum to 1"}),
    }
    if total.infinite:
        cert.update({total.key: INFINITE, "epsilon": INFINITE, "delta": "0",
                     "note": "infinite budget: no noise is added, the output is NOT private (tests only)"})
        return cert
    cert.update(total.certified(budget.delta, CURVE_DELTAS))
    return cert


def composed(entries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The privacy loss of all products together (one record is in every product's input).

    Tight: the rhos add (zCDP composition) and the sum converts to epsilon at the same delta (the smallest
    of the products' deltas) by the CKS conversion. The Bureau's published figure (19.61 for the 2021
    redistricting release: persons 17.14 + units 2.47) adds the products' epsilons, each at its own delta,
    so it holds at the sum of the deltas (basic composition of (epsilon, delta)-DP)."""
    budgets = {name: of_entry(p) for name, p in entries.items()}
    total = compose(budgets.values())
    if total.infinite:
        return {"products": list(entries), "rho": INFINITE, "epsilon": INFINITE,
                "note": "a product has an infinite budget: the release is NOT private"}
    if total.pure:
        return {"products": list(entries), "framework": "pure epsilon-DP (epsilons add)", "epsilon": str(total),
                "epsilon_float": float(total.value), "delta": "0"}
    assert isinstance(total, Rho) and total.value is not None
    delta = min(Fraction(entries[name]["delta"]) for name, b in budgets.items() if not b.pure)
    bureau_delta = sum((Fraction(p["delta"]) for p in entries.values()), Fraction(0))
    return {
        "products": list(entries),
        "framework": "rho-zCDP (rhos add; pure epsilon-DP counted as epsilon^2/2-zCDP)",
        "rho": str(total), "rho_float": float(total.value), "delta": str(delta), "delta_float": float(delta),
        "epsilon": total.epsilon_at(delta),
        "epsilon_bun_steinke": zcdp_to_epsilon_bun_steinke(total.value, delta),
        "epsilon_bureau": sum(b.epsilon_at(Fraction(entries[name]["delta"])) for name, b in budgets.items()),
        "epsilon_bureau_delta": str(bureau_delta), "epsilon_bureau_delta_float": float(bureau_delta),
        "conversion": "epsilon: CKS 2020 (tight) of the summed rho at delta; epsilon_bureau: the products' "
                      "epsilons added (the Bureau's published accounting, e.g. 17.14 + 2.47 = 19.61), which "
                      "holds at delta epsilon_bureau_delta (the deltas add)",
    }


def certificate(config: Config, spine_budget: Mapping[str, PathShares] | None = None,
                bypassing: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The privacy certificate of ``config``: one top-level entry per product in ``config.run.products``
    (``persons``, ``units``), beside ``run``, ``mode`` (``production`` draws from the OS CSPRNG, without a
    seed; ``test`` from the seeded counter-based stream), ``private`` (false for a test-mode run, whose noise
    anyone with the seed can regenerate, an infinite budget, or production checks waived by ``[run]
    weaken_privacy``, then listed as ``waivers``), ``noise_reproducible_from_seed``,
    ``composed`` (all products together, see :func:`composed`; in production with the release ceiling it is held
    to, :data:`~.budget.RELEASE_CEILING`) and ``config_sha256``.

    ``spine_budget`` optionally maps a product name to its per-block path shares (see
    :func:`check_path_condition`) when the spine moved budget between levels, and ``bypassing`` a product name
    to what that concentrates on single nodes (:func:`~.accounting.bypass_report`), recorded as the product's
    ``bypassing``. The configured budget is checked first (:func:`~.accounting.check_noise`).
    """
    spine_budget = spine_budget or {}
    check_noise(config)
    entries = {p.name: _product_certificate(p, config.product(p.name), spine_budget.get(p.name), config.source)
               for p in config.run_products}
    for name, report in (bypassing or {}).items():
        entries[name]["bypassing"] = {**report, "note": BYPASSING_NOTE}
    seeded = config.run.mode == "test"
    infinite = any(p["epsilon"] == INFINITE for p in entries.values())
    waivers = list(config.run.weaken_privacy)
    cert: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run": config.run.name,
        "mode": config.run.mode,
        "private": not seeded and not infinite and not waivers,
        "noise_reproducible_from_seed": seeded,
        "randomness": ("operating-system CSPRNG (os.urandom), no seed" if not seeded
                       else f"seeded counter-based Philox stream keyed by (seed, product, level, node, query); "
                            f"seed {config.run.seed}"),
        "config_sha256": config.digest(),
        **entries,
        "composed": composed(entries),
    }
    if config.run.mode == "production":  # the ceiling production enforces, unless waived
        cert["composed"]["ceiling"] = RELEASE_CEILING.entry(composed_budget(config))
    if waivers:
        cert["waivers"] = waivers
    warnings = ([NOT_PRIVATE_WARNING] if seeded
                else ["an infinite budget adds no noise: NOT private"] if infinite else [])
    if waivers:
        warnings.append(waived_warning(waivers))
    if warnings:
        cert["warning"] = "; ".join(warnings)
    return cert


#: What a product's ``bypassing`` entry means (the certificate records it beside the figures).
BYPASSING_NOTE = ("the spine bypasses levels where a node has a single child: the child then carries its parent's "
                  "share too, so these nodes' queries get less noise than their level's; the noise floor judges the "
                  "configured strategy, per level and query, and these nodes are reported, not refused")


def write_certificate(path: Path, cert: dict[str, Any]) -> None:
    """Write ``cert`` to ``path`` (``topdown privacy --out``) atomically, its folder made if missing, with the
    marker of the command inside. ``path`` must be absent or an earlier certificate of ``topdown privacy``, outside
    any run directory (``outdir.claimed_file``): anything else is refused (``RunDirError``) before it is
    touched."""
    with claimed_file(path, "privacy") as marker:
        write_json_atomic(Path(path), {**cert, MARKER_KEY: marker})


#: What a test-mode run is (the run warns of it, the certificate records it).
NOT_PRIVATE_WARNING = ("test mode: the noise is reproducible from the seed, so these outputs give NO privacy "
                       "(use mode = \"production\" for a release)")


def waived_warning(waivers: list[str]) -> str:
    """What a run that waives production checks is (the run warns of it, the certificate records it)."""
    return (f"[run] weaken_privacy = {waivers!r} waives production privacy checks: these outputs are NOT "
            "certified private (docs/how-to/production.md)")


class NotPrivateWarning(UserWarning):
    """A run whose outputs are not certified private: test mode, or production checks waived."""


def warn_not_private(config: Config, stacklevel: int = 2) -> None:
    """Warn (:class:`NotPrivateWarning`) that a run of ``config`` is in test mode or waives production checks,
    every time it is called: each run warns once, also a second one from the same line (``warnings.warn`` shows
    a message once per place). The warning points at the caller's caller (``stacklevel``); the command line
    prints it as one line, ``topdown: WARNING: ...``."""
    texts = ([f"seed {config.run.seed}, {NOT_PRIVATE_WARNING}"] if config.run.mode == "test" else []) + (
        [waived_warning(config.run.weaken_privacy)] if config.run.weaken_privacy else [])
    frame = sys._getframe(stacklevel)
    for text in texts:
        warnings.warn_explicit(text, NotPrivateWarning, frame.f_code.co_filename, frame.f_lineno,
                               module=frame.f_globals.get("__name__"), registry={})


def draw_summary(cert: dict[str, Any]) -> dict[str, Any]:
    """What a later certificate keeps of an earlier draw's: its run, mode, configuration and budgets."""
    return {"run": cert.get("run"), "mode": cert.get("mode"), "config_sha256": cert.get("config_sha256"),
            "products": {name: {k: p[k] for k in ("mechanism", "rho", "epsilon", "delta") if k in p}
                         for name, p in products(cert).items()}}


def _composed_loss(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Sequential composition of one product's draws (summaries of :func:`draw_summary`): rho adds under
    zCDP; a pure epsilon-DP draw counts as epsilon^2/2-zCDP (Bun and Steinke 2016, Proposition 1.4);
    only pure-DP draws: epsilon adds."""
    budgets = [of_entry(d) for d in draws]
    total = compose(budgets)
    if total.infinite:
        return {"draws": len(draws), "rho": INFINITE, "epsilon": INFINITE, "note": "a draw had an infinite budget"}
    if total.pure:
        return {"draws": len(draws), "epsilon": str(total), "epsilon_float": float(total.value), "delta": "0"}
    delta = [Fraction(d["delta"]) for d, b in zip(draws, budgets) if not b.pure][-1]
    return {"draws": len(draws), "rho": str(total), "rho_float": float(total.value), "delta": str(delta),
            "epsilon": total.epsilon_at(delta)}


def with_draws(cert: dict[str, Any], prior: list[dict[str, Any]]) -> dict[str, Any]:
    """``cert`` with its ``draws`` field: the earlier draws over the same data that this run directory
    released (summaries, oldest first; see ``--redraw``) and, when there are any, every product's
    privacy loss composed over all draws."""
    draws: dict[str, Any] = {"count": len(prior) + 1, "prior": prior}
    if prior:
        everything = [*prior, draw_summary(cert)]
        names = list(dict.fromkeys(n for d in everything for n in d["products"]))
        draws["composed"] = {n: _composed_loss([d["products"][n] for d in everything if n in d["products"]])
                             for n in names}
        draws["test_mode_draws"] = sum(d["mode"] != "production" for d in everything)
        draws["note"] = (f"this run directory released {len(everything)} independent draws over the same data: "
                         "their privacy losses compose (rho adds); a test-mode draw is reproducible from its seed "
                         "and protects nothing")
    return {**cert, "draws": draws}


def products(cert: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-product entries of a certificate (the entries that name themselves as a product)."""
    return {name: entry for name, entry in cert.items() if isinstance(entry, dict) and entry.get("product") == name}


def _fmt(value: Any, width: int) -> str:
    if isinstance(value, float):
        text = "inf" if math.isinf(value) else f"{value:.6g}"
    else:
        text = str(value)
    return text.rjust(width) if isinstance(value, (int, float)) else text.ljust(width)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    widths = [max(len(c), *(len(_fmt(r.get(c, ""), 0)) for r in rows)) for c in columns]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  " + "  ".join(_fmt(r.get(c, ""), w) for c, w in zip(columns, widths)) for r in rows]
    return lines


def render_certificate(cert: dict[str, Any]) -> str:
    """A readable text rendering of :func:`certificate`'s output."""
    lines = [f"Privacy certificate: run {cert['run']} (mode {cert['mode']}, config sha256 {cert['config_sha256'][:12]})"]
    lines.append(f"  randomness: {cert['randomness']}")
    if "warning" in cert:
        lines.append(f"  WARNING: {cert['warning']}")
    for name, c in cert.get("draws", {}).get("composed", {}).items():
        total = f"rho = {c['rho']}" if "rho" in c else f"epsilon = {c['epsilon']}"
        lines.append(f"  COMPOSED over {c['draws']} draws in this run directory: {name} {total}"
                     + (f", (epsilon, delta) = ({c['epsilon']:.4f}, {float(Fraction(c['delta'])):.0e})"
                        if isinstance(c.get("epsilon"), float) else ""))
    for name, p in products(cert).items():
        lines.append("")
        lines.append(f"[{name}] {p['mechanism']}, {p['framework']}")
        if "note" in p:
            lines.append(f"  {p['note']}")
        total = of_entry(p)
        if not total.infinite and not total.pure:
            lines.append(f"  total rho = {p['rho']} = {p['rho_float']:.6g}")
            lines.append(f"  (epsilon, delta) = ({p['epsilon']:.4f}, {p['delta_float']:.0e})  "
                         f"[Bun-Steinke: {p['epsilon_bun_steinke']:.4f}]")
            lines.append("  epsilon at other deltas: " +
                         ", ".join(f"{c['delta']:.0e}: {c['epsilon']:.2f}" for c in p["curve"]))
        elif not total.infinite:
            lines.append(f"  total epsilon = {p['epsilon']} = {p['epsilon_float']:.6g} (pure DP, delta = 0)")
        lines.append("  per level:")
        lines += _table(p["levels"], ["level", "share", total.key])
        lines.append("  per query:")
        cols = ["level", "query", "share", total.key, total.noise_column, "variance"]
        lines += _table(p["queries"], cols)
        pc = p["path_condition"]
        lines.append(f"  path condition (Theorem 2): {'holds' if pc['holds'] else 'FAILS'}"
                     + (f" for {pc['blocks']} blocks" if "blocks" in pc else f" ({pc.get('note', '')})"))
        if "bypassing" in p:
            b, top = p["bypassing"], p["bypassing"]["largest"]
            lines.append(f"  bypassing: {b['nodes']} nodes hold more than their level's share, {b['nodes_above_floor']} "
                         f"with a query exact with probability above {b['floor']} (largest {top['exact_probability']:.2f}: "
                         f"{top['level']} \"{top['query']}\" at share {top['node_share']})")
    c = cert["composed"]
    lines += [] if "ceiling" not in c else ["", (
        f"release ceiling: rho = {c['ceiling']['rho_float']:.4f}, the run's products composed "
        f"{c['ceiling']['composed_rho_float']:.4f} ({'within it' if c['ceiling']['within'] else 'ABOVE IT'}); "
        f"{c['ceiling']['source']}")]
    if len(c["products"]) < 2:
        return "\n".join(lines)
    lines.append("")
    if c["epsilon"] == INFINITE:
        lines.append(f"[{' + '.join(c['products'])} composed] {c['note']}")
    elif "rho" in c:
        lines.append(f"[{' + '.join(c['products'])} composed] rho = {c['rho']} = {c['rho_float']:.6g}; "
                     f"(epsilon, delta) = ({c['epsilon']:.4f}, {c['delta_float']:.0e}) tight "
                     f"[Bun-Steinke: {c['epsilon_bun_steinke']:.4f}]; the Bureau's accounting (epsilons "
                     f"added): {c['epsilon_bureau']:.4f} at delta {c['epsilon_bureau_delta_float']:.0e}")
    else:
        lines.append(f"[{' + '.join(c['products'])} composed] total epsilon = {c['epsilon']} (pure DP, delta = 0)")
    return "\n".join(lines)
