"""The demo run's outputs, pinned byte for byte: a refactoring must not change one byte.

Every file of the run directory is pinned by SHA-256. ``manifest.json`` is the one file with fields that
differ between identical runs: wall-clock timings (``timings``, ``*_seconds``), the absolute path of the
configuration file (``config_source``) and the run directory's id (``output_id``, of its marker: outdir.py); it is
pinned in a canonical form without them (keys sorted, compact). ``config.json`` records where the input was read
(``run.input``, a temporary folder here): it is pinned without that key, and the manifest without its SHA-256.
``manifest.json`` and ``certificate.json`` carry ``schema_version`` (added with the typed run reader, after
these pins were taken): it is checked to be the current version and then removed, and the
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

import pytest

from topdown.pipeline.runtime.rundir import SCHEMA_VERSION

PINNED = {
    'certificate.json': '609a979b90490764a58972585585339ea264c2ec12dade7ee0a55d8109641fe1',
    'config.json': 'af4be0fc8f6771e9cee51887e37af46b15ca786a16c76c6aaca7a06f1a383b28',
    'histograms/persons/level=Block/part-00000.parquet': 'b16a9e6ff60abf11db43d2fc2f3aa01e15642bfc7722f9ce65f67eaf396307df',
    'histograms/persons/level=Block/part-00001.parquet': 'cf67cb1e5a346d7efd082c1ed1388a6f4292f67e1ef28d07a8b0af9a3ff64484',
    'histograms/persons/level=Block_Group/part-00000.parquet': 'b337d1455b9af25c85a5cb1eef1c67546958176c6f439659d1daae8cf80576f4',
    'histograms/persons/level=County/part-00000.parquet': 'c04e700f31d65bfd2eb20c158d3ad097619abcd1460e78db3a9f85e77de0461b',
    'histograms/persons/level=State/part-00000.parquet': '1e87cbd99bd81ceb24ff6b649c43605d66865d52a9320da9cbf881635dd32f0f',
    'histograms/persons/level=Tract/part-00000.parquet': '55cb61531da65963816c3bead2abb60bcf52c62acdbd8a175c271f03ebc0df20',
    'histograms/persons/level=US/part-00000.parquet': 'a5b76fba151a02a24ca9a9890de750aea05df49b99eb059b5e474a20674c875a',
    'histograms/units/level=Block/part-00000.parquet': '52f722fe1657e8d504786d5201fc5be46fc1de4b552001748658727335e5203d',
    'histograms/units/level=Block/part-00001.parquet': 'c81e1fba37f181708982674ffae2b757a669f3e1f6faf9901fa676a3534273f2',
    'histograms/units/level=Block_Group/part-00000.parquet': 'b56f51f3b127352d39b404ad0d7bd8ee587e4570e72f0ebd2983b313765fda49',
    'histograms/units/level=County/part-00000.parquet': '28f503e63193943ccce50ebfba5f230d9fa1a55b067239c6e3fe09c3cece2481',
    'histograms/units/level=State/part-00000.parquet': 'f794d00048db774e8efc11950a7070a7413d97b3c7b6117e79aec192c6dced2c',
    'histograms/units/level=Tract/part-00000.parquet': 'ce38a1f8b3ed36143bbaa448b024f41c02640add303366af755947f67d6fbcf0',
    'histograms/units/level=US/part-00000.parquet': '77278fca9381ce840b02be3bb6551f238055f60112c7fc461deda327d4159f96',
    'invariants/persons.parquet': 'dd05ff564c7faf721f09325c29672e266def3784f771eefec72ef28e085bcd36',
    'invariants/units.parquet': '98e087cc352ee9a912b5ef452ca1432b4abfe4637755b9a1e74635c6a1c1ab45',
    'manifest.json': 'fbce02e025009c0b7a5944451922254d275435ef727c959e82cef84630cea26c',
    'mdf/persons/county=44007/part-00000.parquet': '3dbcddc294f41783572f465562abcbe7e38b71dfcd639f49e6b63d77eb760cb1',
    'mdf/units/county=44007/part-00000.parquet': '5b37df50467d4a282d2b93af948f24693319b5ab09f37f2a70bb9c7b037f2041',
    'noisy_measurements/persons/level=Block/part-00000.parquet': '800fb4070b45c6f7064c52a51c86a9ae37221bd5dfeb76515aa804d2dbef027b',
    'noisy_measurements/persons/level=Block/part-00001.parquet': '21563229135e9547d2b0326222ae12c9461537cffd2eecf340f35a92616746ec',
    'noisy_measurements/persons/level=Block_Group/part-00000.parquet': '40c97148b23d2da75443be4757e78207f9f0bd7d843ee8f104e78f36c464bb7d',
    'noisy_measurements/persons/level=County/part-00000.parquet': '4d5e4aa5d21d84d18c21e6adcfbd8cfa75bc1f08176bfe20dcc8d50132d3677c',
    'noisy_measurements/persons/level=State/part-00000.parquet': 'c6bb532a0e27ef5d4987042b89ddc1e4d56bbe25fd9be9b719adabc796ad1975',
    'noisy_measurements/persons/level=Tract/part-00000.parquet': '495ff259d733f9e91819d1f422f017a87480b26e80754d7cfa47e15e8fbe1d62',
    'noisy_measurements/persons/level=US/part-00000.parquet': '17f5a82684ba1dd5bcadafe2b82592380247b0749d4cc80b20566d9b2f78e85c',
    'noisy_measurements/units/level=Block/part-00000.parquet': '7c61cb86b4603599dfe0039fdbd93052bc88fd033648ad98bc1869c9d0dccdd3',
    'noisy_measurements/units/level=Block/part-00001.parquet': 'cfc922e068d6ca4879ab539d186a89ff5356df5cd56b1fa6ec0d072bee7a0ac4',
    'noisy_measurements/units/level=Block_Group/part-00000.parquet': '5ec6f43e04baf86580064eb1d5a192565c71b9da52ed81d5d165dc16d9092e2b',
    'noisy_measurements/units/level=County/part-00000.parquet': '76962d26ba1fb3b3671dd6010c50e65c03dd3886d2cf026094c4dd073ac7d31b',
    'noisy_measurements/units/level=State/part-00000.parquet': '715de520a0ae538cf553074cc2e213fd905ab70e4a01f03d3641ebaec5998b9d',
    'noisy_measurements/units/level=Tract/part-00000.parquet': 'e870b5265eee5565598582ba94d6036a5b5a10c07313d02af86ab4a01ee6849d',
    'noisy_measurements/units/level=US/part-00000.parquet': '29ad18a581098dcd33dc52daf8d084253c41acf3cadcb5402e0f18bc96a67f82',
    'spine.parquet': 'cd2814f2b6a3fef04d31e520d17731f770164b64b607d43ed00dc12835d2ba4c',
}

VOLATILE_KEYS = {"timings", "config_source", "output_id"}


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

    manifest = strip(_without_version(data))
    manifest["output_sha256"].pop("config.json")  # holds the input's location: compared in its canonical form
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def _canonical_config(data: bytes) -> bytes:
    config = json.loads(data)
    assert config["run"].pop("input")  # where the input lies (a temporary folder here), not what it holds
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _canonical_certificate(data: bytes) -> bytes:
    return (json.dumps(_without_version(data), indent=2, sort_keys=False, default=str) + "\n").encode()


CANONICAL = {"manifest.json": _canonical_manifest, "certificate.json": _canonical_certificate,
             "config.json": _canonical_config}


def output_hashes(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a run directory (manifest.json in its canonical form), by relative path."""
    out = {}
    for f in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = f.relative_to(run_dir).as_posix()
        data = f.read_bytes()
        out[rel] = hashlib.sha256(CANONICAL[rel](data) if rel in CANONICAL else data).hexdigest()
    return out


@pytest.mark.smoke  # the default selection's one pipeline run
def test_demo_outputs_are_byte_identical(demo_run: Path) -> None:
    got = output_hashes(demo_run)
    assert sorted(got) == sorted(PINNED), "the set of output files changed"
    changed = [name for name in PINNED if got[name] != PINNED[name]]
    assert not changed, f"outputs changed: {changed}"


if __name__ == "__main__":
    for name, digest in output_hashes(Path(sys.argv[1])).items():
        print(f"    {name!r}: {digest!r},")
