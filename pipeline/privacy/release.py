"""One release per run directory: a production run never draws noise a second time over levels whose noisy
measurements are already in place, unless the user asks for it (``--redraw``); the certificate then
composes every draw the directory released (certificate.with_draws).

A production draw is a release: its noisy measurements may have been copied or published already, and
a second independent draw over the same data doubles the privacy loss (rho adds under zCDP). Test-mode
noise is reproducible from its seed and protects nothing, so a fresh test-mode run simply replaces
everything the directory held.
"""
from __future__ import annotations

from typing import Any

from .certificate import draw_summary
from ..configuration.config import Config
from ..runtime.rundir import RunDir, RunDirError, RunReader


class SecondRelease(RunDirError):
    """A production run would draw noise again over levels that already hold noisy measurements."""


def _levels_text(levels: dict[str, list[str]]) -> str:
    return "; ".join(f"{product}: {', '.join(lv)}" for product, lv in levels.items())


def _old_certificate(reader: RunReader) -> dict[str, Any] | None:
    try:
        return reader.certificate().data
    except RunDirError:  # missing, unreadable or of a newer version
        return None


def prior_draws(rundir: RunDir, config: Config, manifest: dict, resume: bool, redraw: bool) -> list[dict[str, Any]]:
    """The earlier draws this run's certificate must compose with (oldest first).

    ``manifest`` is the directory's manifest (its ``completed`` levels are read back by a resumed run, not
    drawn again). Raises :class:`SecondRelease` when a production run would draw again over levels whose
    measurements are in place and ``redraw`` is not set, or when it is set but the earlier draw's
    certificate is missing, so that the composition cannot be stated.
    """
    reader = RunReader(rundir.root)  # the directory's earlier outputs are read through the one reader
    released = reader.measured_levels()
    if config.run.mode != "production":
        return [] if not resume else list((_old_certificate(reader) or {}).get("draws", {}).get("prior", []))
    completed = manifest.get("completed", {}) if resume else {}
    again = {p: [lv for lv in levels if lv not in completed.get(p, [])] for p, levels in released.items()}
    again = {p: levels for p, levels in again.items() if levels}
    old = _old_certificate(reader)
    history = list((old or {}).get("draws", {}).get("prior", []))
    if not again:
        return history
    if not redraw:
        raise SecondRelease(
            f"{rundir.root} already holds noisy measurements ({_levels_text(again)}); a new draw in production mode "
            "would be a second release of the same data. Use --resume to continue an interrupted run, another "
            "--out directory, or --redraw to draw again (the certificate then composes both draws)")
    if old is None or "mode" not in old:
        raise SecondRelease(f"{rundir.root / 'certificate.json'}: missing or unreadable, so the earlier draw's privacy "
                            "loss is unknown and --redraw cannot compose it; use another --out directory")
    return [*history, draw_summary(old)]
