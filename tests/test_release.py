"""One release per run directory (release.py): a production run never draws noise twice over released
levels without --redraw, whose certificate then composes the draws; a fresh test-mode run (--force)
leaves nothing of the earlier configuration behind."""
from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import pytest

from rel_inputs import leaked_secrets
from topdown.pipeline import load_config, run
from topdown.pipeline.privacy.budget import zcdp_to_epsilon
from topdown.pipeline.privacy.certificate import _composed_loss, render_certificate
from topdown.pipeline.cli import EXIT_RUNDIR, main
from topdown.pipeline.privacy.release import SecondRelease
from topdown.pipeline.outputs.verify import verify_run
from topdown.pipeline.runtime.outdir import new_marker

PRODUCTION_TOML = 'include = "demo.toml"\n\n[run]\nname = "release"\nmode = "production"\n'


@pytest.fixture
def production(tmp_path) -> Path:
    path = tmp_path / "production.toml"
    path.write_text(PRODUCTION_TOML)
    return path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _cert(root: Path) -> dict:
    return json.loads((root / "certificate.json").read_text())


class _Interrupted(Exception):
    pass


def _interrupt_at(product: str, level: str):
    def progress(p: str, lv: str, done: int, total: int) -> None:
        if (p, lv) == (product, level):
            raise _Interrupted

    return progress


def test_second_production_draw_is_refused_and_redraw_composes(tmp_path, planted, production, dask_client, capsys):
    out = tmp_path / "run"
    config = load_config(production)
    run(config, out, input_dir=planted, client=dask_client)
    first = _cert(out)
    assert first["draws"] == {"count": 1, "prior": []}
    before = _snapshot(out)
    base = ["run", str(production), "--out", str(out), "--input", str(planted), "--quiet"]
    for flags, words in (([], "use --redraw"), (["--force"], "second release of the same data")):
        assert main([*base, *flags]) == EXIT_RUNDIR
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1 and leaked_secrets(err) == [], err
    assert _snapshot(out) == before  # refused before anything was touched

    for n in (2, 3):
        run(config, out, input_dir=planted, client=dask_client, redraw=True)
        cert = _cert(out)
        assert cert["draws"]["count"] == n and len(cert["draws"]["prior"]) == n - 1
        assert cert["draws"]["prior"][0]["products"]["persons"]["rho"] == first["persons"]["rho"]
        for product in ("persons", "units"):
            rho = Fraction(first[product]["rho"])
            composed = cert["draws"]["composed"][product]
            assert composed["draws"] == n and Fraction(composed["rho"]) == n * rho
            assert composed["epsilon"] == pytest.approx(zcdp_to_epsilon(n * rho, Fraction(first[product]["delta"])))
            assert cert[product]["rho"] == first[product]["rho"]  # this draw's own budget is unchanged
        assert cert["draws"]["test_mode_draws"] == 0 and "compose" in cert["draws"]["note"]
        assert f"COMPOSED over {n} draws" in render_certificate(cert)
    assert leaked_secrets((out / "certificate.json").read_text() + (out / "manifest.json").read_text()) == []
    assert verify_run(out).ok


def test_interrupted_production_run_resumes_but_a_fresh_draw_is_refused(tmp_path, planted, production, dask_client):
    out = tmp_path / "run"
    config = load_config(production)
    with pytest.raises(_Interrupted):
        run(config, out, input_dir=planted, client=dask_client, progress=_interrupt_at("persons", "Block"))
    released = ["Block_Group", "County", "State", "Tract", "US"]
    with pytest.raises(SecondRelease, match="persons: " + ", ".join(released)):
        run(config, out, input_dir=planted, client=dask_client)
    assert (out / ".staging").exists()  # the refusal kept what --resume needs
    run(config, out, input_dir=planted, client=dask_client, resume=True)
    assert _cert(out)["draws"] == {"count": 1, "prior": []}
    assert verify_run(out).ok


def test_redraw_needs_the_earlier_certificate(tmp_path, planted, production, dask_client):
    out = tmp_path / "run"
    (out / "noisy_measurements" / "persons" / "level=US").mkdir(parents=True)
    # a run directory by its marker (--out refuses other folders)
    (out / "manifest.json").write_text(json.dumps({**new_marker("run"), "status": "running"}))
    with pytest.raises(SecondRelease, match="certificate.json: missing or unreadable"):
        run(load_config(production), out, input_dir=planted, client=dask_client, redraw=True)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "noisy_measurements"]


def test_force_in_test_mode_removes_every_output_of_the_earlier_configuration(tmp_path, planted, planted_run,
                                                                            dask_client):
    out = tmp_path / "run"
    shutil.copytree(planted_run, out)
    (out / "evaluation").mkdir()
    (out / "evaluation" / "summary.parquet").write_bytes(b"the user's")
    (out / "notes.txt").write_text("the user's own file")
    persons_only = load_config("demo").with_overrides(products=["persons"])
    run(persons_only, out, input_dir=planted, client=dask_client, force=True)
    for stale in ("noisy_measurements/units", "histograms/units", "mdf/units", "invariants/units.parquet"):
        assert not (out / stale).exists(), stale
    assert (out / "notes.txt").read_text() == "the user's own file"  # not the run's: left alone
    assert (out / "evaluation" / "summary.parquet").read_bytes() == b"the user's"
    assert json.loads((out / "manifest.json").read_text())["products"] == ["persons"]
    assert "units" not in _cert(out)
    assert verify_run(out).failures == [f"{name}: not listed in the manifest (not an output of the run)"
                                        for name in ("evaluation/summary.parquet", "notes.txt")]


def test_composition_of_pure_and_zcdp_draws():
    geometric = {"mechanism": "geometric", "epsilon": "2", "delta": "0"}
    gaussian = {"mechanism": "discrete_gaussian", "rho": "1/2", "epsilon": 1.0, "delta": "1/10000000000"}
    both = _composed_loss([geometric, gaussian])
    assert Fraction(both["rho"]) == Fraction(5, 2)  # 2^2/2 + 1/2 (pure eps-DP is eps^2/2-zCDP)
    assert both["epsilon"] == pytest.approx(zcdp_to_epsilon(Fraction(5, 2), Fraction(1, 10**10)))
    assert _composed_loss([geometric, geometric])["epsilon"] == "4"
    assert _composed_loss([gaussian, {**gaussian, "rho": "inf"}])["rho"] == "inf"

