"""The demo run's outputs, pinned byte for byte (issue 15, item 7): a refactoring must not change one byte.

Every file of the run directory is pinned by SHA-256. ``manifest.json`` is the one file with fields that
differ between identical runs: wall-clock timings (``timings``, ``*_seconds``) and the absolute path of the
configuration file (``config_source``); it is pinned in a canonical form without them (keys sorted, compact).
``manifest.json`` and ``certificate.json`` carry ``schema_version`` (added by issue 15 with the typed run
reader, after these pins were taken): it is checked to be the current version and then removed, and the
certificate re-serialised exactly as the run writes JSON, so every other byte is still compared with the
pins taken before the refactoring.
If an intended change alters an output, regenerate the table with ``python tests/test_output_hashes.py RUN_DIR``
and say why in the commit.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from topdown.pipeline.execution.rundir import SCHEMA_VERSION

PINNED = {
    'certificate.json': 'da35eefe093843fe9e37d6ff8f132bfa3d8d68ea4ba46cf7aadec2370c52ed8f',
    'config.json': 'd0236f9077784f8df511433aa9a0b27c5f57ae8ab3882da69adc56d5db999c38',
    'histograms/persons/level=Block/part-00000.parquet': '1aa38870a8f0ba0cbb91fba767f7b08f6d14902a159e310f64e4c82860f97869',
    'histograms/persons/level=Block/part-00001.parquet': '27209845c9b6b1b7488933507e733071c5c75eeb8dbeea480f049440c3f84c51',
    'histograms/persons/level=Block_Group/part-00000.parquet': 'a58b69b9194bc9aa801d37317ad72e5a2d6f759846f83b29b0c66f1b4d6ac9fa',
    'histograms/persons/level=County/part-00000.parquet': 'c04e700f31d65bfd2eb20c158d3ad097619abcd1460e78db3a9f85e77de0461b',
    'histograms/persons/level=State/part-00000.parquet': '1e87cbd99bd81ceb24ff6b649c43605d66865d52a9320da9cbf881635dd32f0f',
    'histograms/persons/level=Tract/part-00000.parquet': 'c9da23b57a72117ce060e66975d0a743f5fa4f4c6d532e805cfaef1f69250238',
    'histograms/persons/level=US/part-00000.parquet': 'a5b76fba151a02a24ca9a9890de750aea05df49b99eb059b5e474a20674c875a',
    'histograms/units/level=Block/part-00000.parquet': '9fed6ed28ca4f469a30161a6797f7836801fa28cda116d8f0b6848ff86a225ce',
    'histograms/units/level=Block/part-00001.parquet': '7a7ea59a53c9ea2e3b6198adb0c00e85d7cca1c0b37cbabe6a84de3a5c7ddb70',
    'histograms/units/level=Block_Group/part-00000.parquet': 'e2b6fd37dddf80c25c0c81d50e20dc2c1adf137d3c634a1ef3002921754d7eec',
    'histograms/units/level=County/part-00000.parquet': '28f503e63193943ccce50ebfba5f230d9fa1a55b067239c6e3fe09c3cece2481',
    'histograms/units/level=State/part-00000.parquet': 'f794d00048db774e8efc11950a7070a7413d97b3c7b6117e79aec192c6dced2c',
    'histograms/units/level=Tract/part-00000.parquet': 'ce38a1f8b3ed36143bbaa448b024f41c02640add303366af755947f67d6fbcf0',
    'histograms/units/level=US/part-00000.parquet': '77278fca9381ce840b02be3bb6551f238055f60112c7fc461deda327d4159f96',
    'invariants/persons.parquet': 'dd05ff564c7faf721f09325c29672e266def3784f771eefec72ef28e085bcd36',
    'invariants/units.parquet': '98e087cc352ee9a912b5ef452ca1432b4abfe4637755b9a1e74635c6a1c1ab45',
    'manifest.json': '5c7f76a79a3694a57bd77d53e9677a356d1da151960fe8fad6c17b0dccda6fae',
    'mdf/persons/county=44007/part-00000.parquet': '1a6608eb1d66b1d26893fa5c7f8ff955d2dca088cb19f6f9da4f197c5872516a',
    'mdf/units/county=44007/part-00000.parquet': '48cef20e40baf800b7194b0bb0982b9b95d1fd07d66805eb3cfa019086415a8e',
    'noisy_measurements/persons/level=Block/part-00000.parquet': 'b6212f2baba5bc6a2401fde20e1e7249bb0283bdb8fdc36435f96322e1a82f63',
    'noisy_measurements/persons/level=Block/part-00001.parquet': 'dff059228322143ccebd85a006f8ff40538af000c544d360671094251489cd98',
    'noisy_measurements/persons/level=Block_Group/part-00000.parquet': '4668e7d88c249338f219b376363ae3547d4696908303976e5808fcbe0130fe50',
    'noisy_measurements/persons/level=County/part-00000.parquet': 'f5ce6d99838f40454b688ab0c58bcfba74a1db9b5f641610ab5246ea139c1c2a',
    'noisy_measurements/persons/level=State/part-00000.parquet': 'd2b7530a1f78f8342472b8b64509961f345c52ce76da0cd228ba0ad6eaaee55b',
    'noisy_measurements/persons/level=Tract/part-00000.parquet': '8a47659660d3699915b4b653ef2857da7bf39b24976c21f4b1e46a66b7a83a5a',
    'noisy_measurements/persons/level=US/part-00000.parquet': 'bfefb29c8d9e0c50ba8bbb49ec56ba8bd55bcda9360e75588bd1fa933535f830',
    'noisy_measurements/units/level=Block/part-00000.parquet': 'bc87af274b3006142b91a33a570ca2f9ae83ca336858ba96cfecde455c078c04',
    'noisy_measurements/units/level=Block/part-00001.parquet': '926cbe8f812c21c32c7894674f582f17b74577bb548405931ff63a75b47c664b',
    'noisy_measurements/units/level=Block_Group/part-00000.parquet': '52d8506c51eaa0c15dcfdd180fc4badaa14410e2f35d46e204e2f7217d2ec423',
    'noisy_measurements/units/level=County/part-00000.parquet': 'b17093f7e9c9bcd19745955c959bb26a50aed05bf1f0fced14ddad872a95292d',
    'noisy_measurements/units/level=State/part-00000.parquet': '4c4bd3a7c31f74d97da2aec765a56dfd9d922518eb2cd0d790fa11a1fc61771e',
    'noisy_measurements/units/level=Tract/part-00000.parquet': 'bbd109f68d1996a1becc630e2880b41fa18960a77ba9573b2d59461d9752e3db',
    'noisy_measurements/units/level=US/part-00000.parquet': '369f99eeb6af76f8e3e0f44379e41c7b734ddc63efdfa36b87d7fae1465f1e60',
    'spine.parquet': 'cd2814f2b6a3fef04d31e520d17731f770164b64b607d43ed00dc12835d2ba4c',
}

VOLATILE_KEYS = {"timings", "config_source"}


def _without_version(data: bytes) -> dict:
    obj = json.loads(data)
    assert obj.pop("schema_version") == SCHEMA_VERSION
    return obj


def _canonical_manifest(data: bytes) -> bytes:
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE_KEYS and not k.endswith("_seconds")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return json.dumps(strip(_without_version(data)), sort_keys=True, separators=(",", ":")).encode()


def _canonical_certificate(data: bytes) -> bytes:
    return (json.dumps(_without_version(data), indent=2, sort_keys=False, default=str) + "\n").encode()


CANONICAL = {"manifest.json": _canonical_manifest, "certificate.json": _canonical_certificate}


def output_hashes(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a run directory (manifest.json in its canonical form), by relative path."""
    out = {}
    for f in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = f.relative_to(run_dir).as_posix()
        data = f.read_bytes()
        out[rel] = hashlib.sha256(CANONICAL[rel](data) if rel in CANONICAL else data).hexdigest()
    return out


def test_demo_outputs_are_byte_identical(demo_run: Path) -> None:
    got = output_hashes(demo_run)
    assert sorted(got) == sorted(PINNED), "the set of output files changed"
    changed = [name for name in PINNED if got[name] != PINNED[name]]
    assert not changed, f"outputs changed: {changed}"


if __name__ == "__main__":
    for name, digest in output_hashes(Path(sys.argv[1])).items():
        print(f"    {name!r}: {digest!r},")
