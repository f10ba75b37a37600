"""The adversarial catalogue: several hundred requests a careful user or an attacker could make, over every
command, the Python API and a non-U.S. census (conf/census/chile_2017.toml), each with the exit code it must
end with (0 ok; 1 verify failed; 2 configuration/usage; 3 input; 4 run directory/output; never 6, a bug).

Each case is one :class:`Case`: its class (:data:`CLASSES`, what could go wrong), its target (a command or
``api``), a command line whose ``{name}`` fields are filled from the shared fixtures (:data:`FIELDS`), files
to make first (``setup``), and the documented outcome. tests/test_adversarial_catalogue.py runs each case in
a subprocess and judges it; ``python tests/adversarial_tally.py`` counts the catalogue by class and outcome.
A case that found a bug says so (``fixed``: what was wrong, fixed in the code); a problem still open is an
``xfail`` with its reason.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from cli_subprocess import SHORT_CONNECT

EXIT_OK, EXIT_VERIFY, EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR = 0, 1, 2, 3, 4

#: The classes of failure the catalogue tries, by name.
CLASSES = {
    "data-loss": "a user's folder or file taken for an earlier output",
    "published-tree": "an output inside a run directory (confidential or not)",
    "escape": "a name that becomes a path leaving its folder",
    "standalone": "a run directory that does not stand alone (moved, read from elsewhere)",
    "crash": "a traceback or exit 6: paths of the wrong kind, odd numbers, deep or looping configurations",
    "silent": "a bad request or damaged output accepted silently",
    "hang": "an unbounded request that would run without end",
    "two-writers": "two commands on one output",
    "corner": "a wrong answer or a misleading message in a corner",
}

#: The fields a case's command line may name: the shared runs and inputs (U.S. planted input and run; the
#: Chilean synthetic input, its test-mode configuration and run; that run moved with its census declared by a
#: relative path), sources for ingest and spine, and the case's own folder.
FIELDS = ("run", "input", "crun", "cinput", "cconf", "moved", "blocks", "pl94", "baf", "tmp")
LONG = "x" * 300
MOVE = "440070001001001:440070001001002"
Setup = Callable[[Path, dict], None]  # (the case's folder, the fields)


@dataclass(frozen=True)
class Case:
    klass: str
    target: str
    name: str
    argv: tuple[str, ...]
    code: int
    says: tuple[str, ...] = ()
    setup: Setup | None = None
    cwd: str = "{tmp}"
    timeout: float = 120
    writes: bool = False  # a success that writes under the case's folder
    check: Callable[[Path], None] | None = None  # more to assert on the case's folder after a success
    fixed: str = ""  # the bug this case found (fixed in the code)
    env: tuple[tuple[str, str], ...] = ()  # more environment for the command
    xfail: str = ""  # a problem still open

    @property
    def id(self) -> str:
        return f"{self.klass}:{self.target}:{self.name}"


# ------------------------------------------------------------------------------------------------ set-ups
def files(**entries: str | bytes | None) -> Setup:
    """Files under the case's folder (``__`` in a name is a ``/``; None makes a folder, ``"FIFO"`` a FIFO)."""
    def make(tmp: Path, fields: dict) -> None:
        for name, content in entries.items():
            path = tmp / name.replace("__", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if content is None:
                path.mkdir(exist_ok=True)
            elif content == "FIFO":
                os.mkfifo(path)
            elif isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
    return make


def both(*setups: Setup | None) -> Setup:
    def make(tmp: Path, fields: dict) -> None:
        for setup in setups:
            if setup:
                setup(tmp, fields)
    return make


def marker(command: str, **more) -> str:
    from topdown.pipeline.runtime.outdir import new_marker

    return json.dumps({**new_marker(command), **more})


def lock_text() -> str:
    """A lock held by a live process on this host (pid 1)."""
    return f"pid 1 on {os.uname().nodename} since 2026-01-01T00:00:00"


# ------------------------------------------------------------------------------------ what each writer runs
#: Each command that writes, on the U.S. run or input and on the Chilean one: its command line with ``{out}``.
WRITERS: dict[str, tuple[str, ...]] = {
    "run": ("run", "demo", "--input", "{input}", "--out", "{out}", "--workers", "1", "--quiet"),
    "run/chile": ("run", "{cconf}", "--input", "{cinput}", "--out", "{out}", "--workers", "1", "--quiet"),
    "reprocess": ("reprocess", "{run}", "--out", "{out}", "--workers", "1", "--quiet"),
    "reprocess/chile": ("reprocess", "{crun}", "--out", "{out}", "--workers", "1", "--quiet"),
    "nmf": ("nmf", "{run}", "--out", "{out}"),
    "nmf/chile": ("nmf", "{crun}", "--out", "{out}"),
    "evaluate": ("evaluate", "{run}", "--truth", "{input}", "--out", "{out}", "--workers", "1"),
    "evaluate/chile": ("evaluate", "{crun}", "--truth", "{cinput}", "--out", "{out}", "--workers", "1"),
    "replicates": ("replicates", "{run}", "--n", "1", "--out", "{out}", "--workers", "1"),
    "replicates/chile": ("replicates", "{crun}", "--n", "1", "--out", "{out}", "--workers", "1"),
    "audit": ("audit", "demo", "--input", "{input}", "--move", MOVE, "--runs", "1", "--out", "{out}",
              "--workers", "1"),
    "ingest/blocks": ("ingest", "blocks", "{blocks}", "--out", "{out}"),
    "ingest/pl94": ("ingest", "pl94", "{pl94}", "--out", "{out}"),
    "spine": ("spine", "--baf", "{baf}", "--out", "{out}"),
    "synth": ("synth", "--blocks", "3", "{out}"),
    "synth/chile": ("synth", "--census", "chile_2017", "--persons", "100", "{out}"),
    "demo-data": ("demo-data", "{out}"),
}
#: The writers of a file (not a folder).
FILE_WRITERS: dict[str, tuple[str, ...]] = {
    "uncertainty": ("uncertainty", "{run}", "--out", "{out}", "--workers", "1"),
    "uncertainty/chile": ("uncertainty", "{crun}", "--out", "{out}", "--workers", "1"),
    "privacy": ("privacy", "demo", "--out", "{out}"),
    "privacy/chile": ("privacy", "{cconf}", "--out", "{out}"),
}


def with_out(argv: tuple[str, ...], out: str) -> tuple[str, ...]:
    return tuple(out if a == "{out}" else a for a in argv)


def _command(key: str) -> str:
    return key.split("/")[0]


# ------------------------------------------------------------------------------------------- data loss
USER = {"mine__histograms__important.txt": "my notes\n", "mine__config.json": '{"mine": true}\n'}
FOLDERS_OF_A_USER: dict[str, Setup] = {
    "user-files": files(**USER),
    "staging-folder": files(**USER, **{"mine__.staging__chunks__x": "x"}),
    "manifest-with-status": files(**USER, **{"mine__manifest.json": '{"status": "complete", "levels": ["US"], '
                                                                    '"products": ["persons"]}'}),
    "output-file-names": files(**{"mine__persons.parquet": "mine", "mine__units.parquet": "mine",
                                  "mine__nmf.json": "{}", "mine__report.html": "mine", "mine__spine.parquet": "m",
                                  "mine__replicates.json": "{}", "mine__evaluation__a.csv": "a"}),
    "a-users-file": files(mine="my notes\n"),
    "hidden-file-only": files(**{"mine__.notes": "mine"}),
}
#: Each writer meets three of the user's folders: the first and the others in turn.
PER_WRITER = 3


def _other_marker(command: str) -> Setup:
    other = "evaluate" if command != "evaluate" else "nmf"
    return lambda tmp, fields: files(**{"mine__.topdown-output.json": marker(other),
                                        "mine__manifest.json": marker(other), "mine__notes.txt": "mine"})(tmp, fields)


def data_loss() -> list[Case]:
    cases = []
    for i, (key, argv) in enumerate(WRITERS.items()):
        variants = list({**FOLDERS_OF_A_USER, "marker-of-another-command": _other_marker(_command(key))}.items())
        for variant, setup in [variants[0]] + [variants[1 + (i + j) % (len(variants) - 1)]
                                               for j in range(PER_WRITER - 1)]:
            cases.append(Case("data-loss", key, variant, with_out(argv, "{tmp}/mine"), EXIT_RUNDIR, ("mine",),
                              setup=setup))
    for key, argv in FILE_WRITERS.items():
        out = "{tmp}/mine.parquet" if key.startswith("uncertainty") else "{tmp}/mine.json"
        name = out.rsplit("/", 1)[1]
        for variant, setup in {
            "a-users-file": files(**{name: "my notes\n"}),
            "a-users-folder": files(**{name: None, f"{name}__notes.txt": "mine"}),
            "another-commands-file": files(**{name: json.dumps({"topdown_output": json.loads(marker("evaluate"))})}),
        }.items():
            cases.append(Case("data-loss", key, variant, with_out(argv, out), EXIT_RUNDIR, (name,), setup=setup))
    return cases


# ------------------------------------------------------------------------------------ inside a published run
INSIDE = {"run-root": "{R}/extra", "histograms": "{R}/histograms/extra", "mdf-level": "{R}/mdf/persons/extra"}


def published_tree() -> list[Case]:
    cases = []
    for i, (key, argv) in enumerate({**WRITERS, **FILE_WRITERS}.items()):
        run = "{crun}" if key.endswith("/chile") else "{run}"
        for where, template in [list(INSIDE.items())[i % len(INSIDE)]]:
            out = template.replace("{R}", run)
            if key in FILE_WRITERS:
                out += ".parquet" if key.startswith("uncertainty") else ".json"
            cases.append(Case("published-tree", key, where, with_out(argv, out), EXIT_RUNDIR))
    # a confidential output holding a run, or named as the run itself
    for key in ("evaluate", "ingest/blocks", "demo-data", "synth", "nmf"):
        cases.append(Case("published-tree", key, "the-run-itself",
                          with_out(WRITERS[key], "{run}" if key != "synth" else "{crun}"), EXIT_RUNDIR))
    return cases


# --------------------------------------------------------------------------------------------- escapes
def _jobs(name: str) -> Setup:
    return files(**{"jobs.toml": f'[[job]]\nname = {json.dumps(name)}\nkind = "run"\nconfig = "demo"\n'
                                 f'out = "out"\n'})


BAD_NAMES = {"parent": "../escape", "deep-parent": "../../../tmp/escape", "absolute": "/tmp/escape",
             "slash": "a/b", "dot-dot": "..", "dot": ".", "empty": "", "too-long": "x" * 300, "tab": "tab\there",
             "nul": "nul\u0000byte", "newline": "two\nlines", "backslash-parent": "..\\..\\escape"}


def _edited_manifest(key: str, value) -> Setup:
    """A copy of the Chilean run (``run`` in the case's folder) whose manifest's ``key`` is ``value``."""
    return _run_copy_edit(_manifest_set(key, value))


READERS = {
    "verify": ("verify", "{tmp}/run"),
    "nmf": ("nmf", "{tmp}/run", "--out", "{tmp}/nmf"),
    "uncertainty": ("uncertainty", "{tmp}/run", "--out", "{tmp}/u.parquet", "--workers", "1"),
    "reprocess": ("reprocess", "{tmp}/run", "--out", "{tmp}/again", "--workers", "1", "--quiet"),
    "replicates": ("replicates", "{tmp}/run", "--n", "1", "--out", "{tmp}/reps", "--workers", "1"),
    "evaluate": ("evaluate", "{tmp}/run", "--truth", "{cinput}", "--out", "{tmp}/ev", "--workers", "1"),
}
MANIFEST_ESCAPES = {"level-parent": ("levels", ["Nation", "../../escape"]),
                    "level-absolute": ("levels", ["Nation", "/tmp/escape"]),
                    "product-slash": ("products", ["persons", "a/b"]),
                    "completed-parent": ("completed", {"../x": ["Nation"]})}


def escapes() -> list[Case]:
    cases = [Case("escape", "batch", f"job-name-{n}", ("batch", "jobs.toml"), EXIT_CONFIG, ("jobs.toml", "name"),
                  setup=_jobs(v)) for n, v in BAD_NAMES.items()]
    for command, argv in READERS.items():
        for n, (key, value) in [list(MANIFEST_ESCAPES.items())[j % len(MANIFEST_ESCAPES)]
                                for j in (len(cases), len(cases) + 1)]:
            cases.append(Case("escape", command, f"manifest-{n}", argv, EXIT_RUNDIR, ("manifest.json", key),
                              setup=_edited_manifest(key, value)))
    return cases


# ------------------------------------------------------------------------------------------- standalone
def _moved_ok(command: str, argv: tuple[str, ...], made: str) -> Case:
    def check(tmp: Path) -> None:
        assert (tmp / made).exists(), f"{made} not written"
    return Case("standalone", command, "moved-run-from-another-folder", argv, EXIT_OK, cwd="/", writes=True,
                check=check, timeout=300)


def standalone() -> list[Case]:
    return [
        Case("standalone", "verify", "moved-run-from-another-folder", ("verify", "{moved}"), EXIT_OK, cwd="/"),
        Case("standalone", "verify", "moved-run-from-its-own-folder", ("verify", "."), EXIT_OK, cwd="{moved}"),
        Case("standalone", "privacy", "moved-runs-config-json", ("privacy", "{moved}/config.json"), EXIT_CONFIG,
             ("config.json",)),
        _moved_ok("nmf", ("nmf", "{moved}", "--out", "{tmp}/nmf"), "nmf"),
        _moved_ok("uncertainty", ("uncertainty", "{moved}", "--out", "{tmp}/u.parquet", "--workers", "1"),
                  "u.parquet"),
        _moved_ok("evaluate", ("evaluate", "{moved}", "--truth", "{cinput}", "--out", "{tmp}/ev", "--workers",
                               "1", "--quiet"), "ev"),
        _moved_ok("reprocess", ("reprocess", "{moved}", "--out", "{tmp}/again", "--workers", "1", "--quiet"),
                  "again"),
        _moved_ok("replicates", ("replicates", "{moved}", "--n", "1", "--out", "{tmp}/reps", "--workers", "1",
                                 "--quiet"), "reps"),
        Case("standalone", "nmf", "relative-run-path", ("nmf", "run", "--out", "nmf"), EXIT_RUNDIR, ("run",),
             cwd="{tmp}"),
    ]


# ----------------------------------------------------------------------------- paths of the wrong kind
#: A path argument given something that is not what it expects.
KINDS: dict[str, tuple[str, Setup | None]] = {
    "missing": ("{tmp}/nosuch", None),
    "empty-string": ("", None),
    "empty-file": ("{tmp}/empty", files(empty="")),
    "garbage-file": ("{tmp}/garbage", files(garbage=b"\x00\xff\xfe garbage \x89PNG\r\n")),
    "a-folder": ("{tmp}/folder", files(folder=None)),
    "fifo": ("{tmp}/fifo", files(fifo="FIFO")),
    "device": ("/dev/zero", None),
    "too-long": (LONG, None),
    "under-a-file": ("{tmp}/afile/below", files(afile="x")),
}
#: Each path argument by command: the command line with ``{p}`` and the exit code a bad path gets there.
SLOTS: dict[str, tuple[tuple[str, ...], int]] = {
    "run:config": (("run", "{p}", "--input", "{input}", "--out", "{tmp}/out", "--workers", "1"), EXIT_CONFIG),
    "run:input": (("run", "demo", "--input", "{p}", "--out", "{tmp}/out", "--workers", "1"), EXIT_INPUT),
    "run/chile:input": (("run", "{cconf}", "--input", "{p}", "--out", "{tmp}/out", "--workers", "1"), EXIT_INPUT),
    "reprocess:run": (("reprocess", "{p}", "--out", "{tmp}/out", "--workers", "1"), EXIT_RUNDIR),
    "reprocess:config": (("reprocess", "{run}", "--config", "{p}", "--out", "{tmp}/out", "--workers", "1"),
                         EXIT_CONFIG),
    "verify:run": (("verify", "{p}"), EXIT_RUNDIR),
    "privacy:config": (("privacy", "{p}"), EXIT_CONFIG),
    "batch:jobs": (("batch", "{p}"), EXIT_CONFIG),
    "synth:census": (("synth", "--census", "{p}", "--persons", "10", "{tmp}/out"), EXIT_CONFIG),
    "ingest:blocks-source": (("ingest", "blocks", "{p}", "--out", "{tmp}/out"), EXIT_INPUT),
    "ingest:pl94-source": (("ingest", "pl94", "{p}", "--out", "{tmp}/out"), EXIT_INPUT),
    "evaluate:runs": (("evaluate", "{p}", "--truth", "{input}", "--out", "{tmp}/out"), EXIT_RUNDIR),
    "evaluate:truth": (("evaluate", "{run}", "--truth", "{p}", "--out", "{tmp}/out"), EXIT_INPUT),
    "evaluate:entities": (("evaluate", "{run}", "--truth", "{input}", "--entities", "{p}", "--out", "{tmp}/out"),
                          EXIT_INPUT),
    "evaluate:uncertainty": (("evaluate", "{run}", "--truth", "{input}", "--uncertainty", "{p}", "--out",
                              "{tmp}/out"), EXIT_INPUT),
    "evaluate:audit": (("evaluate", "{run}", "--truth", "{input}", "--audit", "{p}", "--out", "{tmp}/out"),
                       EXIT_INPUT),
    "nmf:run": (("nmf", "{p}", "--out", "{tmp}/out"), EXIT_RUNDIR),
    "uncertainty:run": (("uncertainty", "{p}", "--out", "{tmp}/u.parquet"), EXIT_RUNDIR),
    "uncertainty:entities": (("uncertainty", "{run}", "--entities", "{p}", "--out", "{tmp}/u.parquet"),
                             EXIT_INPUT),
    "uncertainty/chile:replicates": (("uncertainty", "{crun}", "--replicates", "{p}", "--out", "{tmp}/u.parquet"),
                                     EXIT_INPUT),
    "replicates:run": (("replicates", "{p}", "--n", "1", "--out", "{tmp}/out"), EXIT_RUNDIR),
    "audit:config": (("audit", "{p}", "--input", "{input}", "--move", MOVE, "--runs", "1", "--out", "{tmp}/out"),
                     EXIT_CONFIG),
    "audit:input": (("audit", "demo", "--input", "{p}", "--move", MOVE, "--runs", "1", "--out", "{tmp}/out"),
                    EXIT_INPUT),
    "spine:baf": (("spine", "--baf", "{p}", "--out", "{tmp}/out"), EXIT_CONFIG),
    "spine:units": (("spine", "--baf", "{baf}", "--units", "{p}", "--out", "{tmp}/out"), EXIT_INPUT),
}


def wrong_kinds() -> list[Case]:
    cases = []
    kinds = list(KINDS.items())
    for i, (slot, (argv, code)) in enumerate(SLOTS.items()):
        target, arg = slot.split(":")
        others = [k for k in kinds if k[0] not in ("missing", "fifo", "device")]
        for kind, (path, setup) in (kinds[0], kinds[5 + i % 2], others[i % len(others)]):
            expected = EXIT_CONFIG if kind in ("too-long", "empty-string", "fifo", "device") else code
            says = {"too-long": ("300 bytes",), "fifo": ("fifo", "not a regular file"),
                    "device": ("/dev/zero", "not a regular file")}.get(kind, ())
            cases.append(Case("crash", target, f"{arg}-{kind}", tuple(path if a == "{p}" else a for a in argv),
                              expected, says, setup=setup, timeout=60))
    return cases


# ----------------------------------------------------------------------------------------------- numbers
#: Each numeric option on a command line that is otherwise fine, and the values it is tried with.
INTS = ("-1", "abc", "1e400", "99999999999999999999", "1.5", "")
NUMBERS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "run:--workers": (WRITERS["run"], "--workers", INTS),
    "run:--seed": (WRITERS["run"], "--seed", INTS),
    "run/chile:--seed": (WRITERS["run/chile"], "--seed", ("-1", "99999999999999999999", "0x10")),
    "reprocess:--workers": (WRITERS["reprocess"], "--workers", ("-1", "abc", "99999999999999999999")),
    "evaluate:--workers": (WRITERS["evaluate"], "--workers", ("-1", "0", "99999999999999999999")),
    "uncertainty:--workers": (FILE_WRITERS["uncertainty"], "--workers", ("-1", "0", "99999999999999999999")),
    "replicates:--n": (WRITERS["replicates"], "--n", INTS + ("0", "1001")),
    "replicates/chile:--n": (WRITERS["replicates/chile"], "--n", ("-5", "0", "100000000000000000000")),
    "replicates:--parallel": (WRITERS["replicates"], "--parallel", ("-1", "0", "abc", "99999999999999999999")),
    "audit:--runs": (WRITERS["audit"], "--runs", INTS + ("0",)),
    "audit:--seed": (WRITERS["audit"], "--seed", ("-1", "abc", "99999999999999999999")),
    "audit:--workers": (WRITERS["audit"], "--workers", ("-1", "99999999999999999999")),
    "synth:--blocks": (WRITERS["synth"], "--blocks", INTS + ("0",)),
    "synth:--seed": (WRITERS["synth"], "--seed", ("-1", "abc", "99999999999999999999")),
    "synth/chile:--persons": (WRITERS["synth/chile"], "--persons", INTS + ("0",)),
    "synth:--states": (WRITERS["synth"], "--states", ("-1", "0", "53", "abc")),
    "synth:--scale": (("synth", "--shape", "us2020", "{out}"), "--scale",
                      ("-1", "0", "nan", "inf", "1e400", "abc", "2")),
}


def _set_option(argv: tuple[str, ...], option: str, value: str) -> tuple[str, ...]:
    argv = with_out(argv, "{tmp}/out")
    if option in argv:
        i = argv.index(option)
        return (*argv[:i + 1], value, *argv[i + 2:])
    return (*argv[:1], option, value, *argv[1:])


def numbers() -> list[Case]:
    cases = []
    for i, (slot, (argv, option, values)) in enumerate(NUMBERS.items()):
        target = slot.split(":")[0]
        for value in [values[(i + j) % len(values)] for j in range(min(3, len(values)))]:
            name = f"{option.lstrip('-')}={value or 'empty'}"
            cases.append(Case("crash", target, name, _set_option(argv, option, value), EXIT_CONFIG, (option,),
                              timeout=60))
    cases += [Case("crash", "batch", f"wait={v}", ("batch", "jobs.toml", "--wait", v), EXIT_CONFIG, ("--wait",),
                   setup=_jobs("fine"), timeout=60) for v in ("-1", "nan", "inf", "1e400", "abc")]
    return cases


# ------------------------------------------------------------------------------------------ configurations
def _config(text: str, **more: str | bytes | None) -> Setup:
    return files(**{"c.toml": text}, **more)


DEEP = "a = " + "[" * 2000 + "]" * 2000 + "\n"
DEEP_TABLES = "[" + ".".join(f"t{i}" for i in range(3000)) + "]\nx = 1\n"
CHAIN = {f"i{i}.toml": f'include = "i{i + 1}.toml"\n' for i in range(200)} | {"i200.toml": 'include = "demo.toml"\n'}

#: Configuration texts that must be refused (exit 2), each after ``include = "<base>"``; ``{base}`` is the
#: preset included.
CONFIG_ATTACKS: dict[str, tuple[str, dict]] = {
    "not-toml": ("this is [not toml\n", {}),
    "binary": ("\x00\x01\x02", {}),
    "deep-arrays": (DEEP, {}),
    "deep-tables": (DEEP_TABLES, {}),
    "include-cycle": ('include = "c.toml"\n', {}),
    "include-missing": ('include = "nosuch.toml"\n', {}),
    "include-folder": ('include = "folder"\n', {"folder": None}),
    "include-fifo": ('include = "fifo"\n', {"fifo": "FIFO"}),
    "include-device": ('include = "/dev/zero"\n', {}),
    "include-too-long": (f'include = "{LONG}.toml"\n', {}),
    "include-not-a-string": ("include = 5\n", {}),
    "unknown-key": ('[run]\nnot_a_key = 1\n', {}),
    "unknown-table": ('[nonsense]\nx = 1\n', {}),
    "seed-string": ('[run]\nseed = "abc"\n', {}),
    "seed-negative": ('[run]\nseed = -5\n', {}),
    "seed-float": ('[run]\nseed = 1.5\n', {}),
    "seed-huge": ('[run]\nseed = 99999999999999999999999\n', {}),
    "seed-inf": ('[run]\nseed = inf\n', {}),
    "rho-tiny-exponent": ('[persons.budget]\nrho = "1e-5000"\n', {}),
    "rho-huge-exponent": ('[persons.budget]\nrho = "1e99999999"\n', {}),
    "rho-long-digits": ('[persons.budget]\nrho = "' + "1" * 5000 + '"\n', {}),
    "rho-not-a-number": ('[persons.budget]\nrho = "abc"\n', {}),
    "rho-negative": ('[persons.budget]\nrho = "-1"\n', {}),
    "rho-zero": ('[persons.budget]\nrho = "0"\n', {}),
    "rho-divide-by-zero": ('[persons.budget]\nrho = "1/0"\n', {}),
    "rho-nan": ('[persons.budget]\nrho = "nan"\n', {}),
    "rho-float": ('[persons.budget]\nrho = 0.5\n', {}),
    "mechanism-unknown": ('[persons.budget]\nmechanism = "laplace"\n', {}),
    "census-missing": ('[run]\ncensus = "nosuch.toml"\n', {}),
    "census-folder": ('[run]\ncensus = "folder"\n', {"folder": None}),
    "census-device": ('[run]\ncensus = "/dev/zero"\n', {}),
    "census-not-toml": ('[run]\ncensus = "bad.toml"\n', {"bad.toml": "[census\n"}),
    "products-unknown": ('[run]\nproducts = ["nosuch"]\n', {}),
    "products-empty": ('[run]\nproducts = []\n', {}),
    "mode-unknown": ('[run]\nmode = "yolo"\n', {}),
    "name-slash": ('[run]\nname = "../escape"\n', {}),
}
#: A few attacks that need the census's own names.
CENSUS_ATTACKS = {
    "us": {"level-share-unknown-level": '[persons.budget.levels]\nNowhere = "1"\n',
           "query-unknown": '[persons.budget.queries.US]\n"nosuch * cenrace" = "1"\n',
           "shares-not-one": '[persons.budget.levels]\nUS = "2"\n'},
    "chile": {"level-share-unknown-level": '[persons.budget.levels]\nBlock = "1"\n',
              "query-unknown": '[persons.budget.queries.Nation]\n"hhgq * sex" = "1"\n',
              "shares-not-one": '[persons.budget.levels]\nNation = "2"\n'},
}
BASES = {"us": 'include = "demo.toml"\n', "chile": 'include = "chile_2017.toml"\n[run]\nmode = "test"\nseed = 1\n'}


#: The name a refusal must give where it is not the configuration's own file.
AT_FAULT = {"include-too-long": "too long", "include-missing": "nosuch.toml", "include-folder": "folder", "include-fifo": "fifo",
            "include-device": "/dev/zero", "census-missing": "nosuch.toml", "census-folder": "folder",
            "census-device": "/dev/zero", "census-not-toml": "bad.toml"}


def _config_text(base: str, attack: str, text: str) -> str:
    if attack in ("not-toml", "binary", "include-cycle", "include-missing", "include-folder", "include-fifo",
                  "include-device", "include-too-long", "include-not-a-string"):
        return text  # the attack replaces the include
    if attack == "seed-negative" and base == "chile":
        text = "[run]\nseed = -5\n"
    if "[run]" in text and "[run]" in BASES[base]:
        return BASES[base] + text.replace("[run]\n", "")
    return BASES[base] + text


def configurations() -> list[Case]:
    cases = []
    for base in BASES:
        attacks = {**CONFIG_ATTACKS, **{k: (v, {}) for k, v in CENSUS_ATTACKS[base].items()}}
        for j, (attack, (text, more)) in enumerate(attacks.items()):
            if base == "chile" and j % 2 and attack not in CENSUS_ATTACKS[base]:
                continue  # the Chilean census meets every other attack and its own
            cases.append(Case("crash", "privacy" if base == "us" else "privacy/chile", attack, ("privacy", "c.toml"),
                              EXIT_CONFIG, (AT_FAULT.get(attack, "c.toml"),), setup=_config(_config_text(base, attack, text), **more),
                              timeout=60))
    chain = files(**{"c.toml": 'include = "i0.toml"\n', **CHAIN})
    cases.append(Case("crash", "privacy", "include-chain-200", ("privacy", "c.toml"), EXIT_CONFIG, ("include",),
                      setup=chain))
    # the same attacks where a configuration is read by other commands: run, audit, reprocess --config, batch
    for attack in ("not-toml", "deep-arrays", "include-fifo", "rho-tiny-exponent", "census-device", "name-slash"):
        text, more = CONFIG_ATTACKS[attack]
        for base in BASES:
            key = "run" if base == "us" else "run/chile"
            inp = "{input}" if base == "us" else "{cinput}"
            cases.append(Case("crash", key, f"config-{attack}", ("run", "c.toml", "--input", inp, "--out", "out",
                                                                 "--workers", "1"), EXIT_CONFIG,
                              (AT_FAULT.get(attack, "c.toml"),), setup=_config(_config_text(base, attack, text), **more),
                              timeout=60))
    for attack in ("not-toml", "deep-arrays", "include-fifo", "rho-huge-exponent", "unknown-key"):
        text, more = CONFIG_ATTACKS[attack]
        cases.append(Case("crash", "audit", f"config-{attack}", ("audit", "c.toml", "--input", "{input}", "--move",
                                                                 MOVE, "--runs", "1", "--out", "out"), EXIT_CONFIG,
                          (AT_FAULT.get(attack, "c.toml"),), setup=_config(_config_text("us", attack, text), **more), timeout=60))
    for attack, text in {"not-toml": "[estimation\n", "deep-arrays": DEEP, "include-fifo": 'include = "fifo"\n',
                         "unknown-key": "[estimation]\nnonsense = 1\n", "budget-change": '[persons.budget]\nrho = "2"\n',
                         "seed": "[run]\nseed = 5\n", "binary": "\x00\xff"}.items():
        cases.append(Case("crash", "reprocess/chile", f"changes-{attack}",
                          ("reprocess", "{crun}", "--config", "c.toml", "--out", "out", "--workers", "1"),
                          EXIT_CONFIG, ("c.toml",), setup=_config(text, **({"fifo": "FIFO"} if "fifo" in attack
                                                                           else {})), timeout=60))
    for attack, text in {
        "not-toml": "[[job]\n", "deep-arrays": DEEP, "no-jobs": "[batch]\n", "unknown-kind":
            '[[job]]\nname = "a"\nkind = "dance"\nconfig = "demo"\nout = "o"\n',
        "missing-out": '[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\n',
        "duplicate-names": '[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "o"\n'
                           '[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "p"\n',
        "same-out-twice": '[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "o"\n'
                          '[[job]]\nname = "b"\nkind = "run"\nconfig = "demo"\nout = "o"\n',
        "workers-negative": '[batch]\nworkers = -1\n[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "o"\n',
        "include-fifo": 'include = "fifo"\n',
    }.items():
        cases.append(Case("crash", "batch", f"jobs-{attack}", ("batch", "jobs.toml"), EXIT_CONFIG, ("jobs.toml",),
                          setup=files(**{"jobs.toml": text}, **({"fifo": "FIFO"} if "fifo" in attack else {})),
                          timeout=60))
    return cases


# ------------------------------------------------------------------------------ declarations of a census
CHILE_DECL = "chile_2017.toml"


def _declaration(edit: Callable[[str], str]) -> Setup:
    """``mine.toml``: the Chilean declaration edited, and ``c.toml`` a test-mode configuration using it."""
    def make(tmp: Path, fields: dict) -> None:
        from topdown.pipeline.configuration.census import census_dir

        text = (census_dir() / CHILE_DECL).read_text()
        (tmp / "mine.toml").write_text(edit(text))
        (tmp / "c.toml").write_text('include = "chile_2017.toml"\n[run]\ncensus = "mine.toml"\nmode = "test"\n'
                                    'seed = 1\n')
    return make


DECLARATION_EDITS: dict[str, Callable[[str], str]] = {
    "two-levels-one-value": lambda t: t.replace("values = [[1, 0], [2, 1]]", "values = [[1, 0], [1, 1]]"),
    "value-out-of-range": lambda t: t.replace("values = [[1, 0], [2, 1]]", "values = [[1, 0], [2, 7]]"),
    "size-zero": lambda t: t.replace("size = 2\ncolumn = \"p08\"", "size = 0\ncolumn = \"p08\""),
    "size-huge": lambda t: t.replace("size = 21", "size = 99999999999"),
    "labels-too-few": lambda t: t.replace('labels = ["Man", "Woman"]', 'labels = ["Man"]'),
    "duplicate-attribute": lambda t: t.replace('name = "age_group"', 'name = "sex"'),
    "duplicate-level": lambda t: t.replace('{ name = "Province", column = "provincia" }',
                                           '{ name = "Region", column = "provincia" }'),
    "no-levels": lambda t: t.replace('levels = [{ name = "Nation" }', 'levels = []\nold = [{ name = "Nation" }'),
    "recode-unknown-attribute": lambda t: t.replace('age_broad = { attribute = "age_group"',
                                                    'age_broad = { attribute = "nosuch"'),
    "recode-bad-group": lambda t: t.replace("groups = [[0, 1, 2]] }", "groups = [[0, 1, 99]] }"),
    "constraint-unknown-query": lambda t: t.replace('total = { query = "total"', 'total = { query = "nosuch"'),
    "zero-where-unknown-attribute": lambda t: t.replace("zero_where = { age_group = [0, 1, 2]",
                                                        "zero_where = { nosuch = [0, 1, 2]"),
    "invariant-unknown-query": lambda t: t.replace('tot = "total"', 'tot = "nosuch"'),
    "synth-weights-negative": lambda t: t.replace("weights.sex = [49, 51]", "weights.sex = [-49, 51]"),
    "synth-weights-wrong-length": lambda t: t.replace("weights.sex = [49, 51]", "weights.sex = [49, 51, 3]"),
    "synth-nodes-zero": lambda t: t.replace("nodes = { Province = 54", "nodes = { Province = 0"),
    "synth-persons-per-leaf-zero": lambda t: t.replace("persons_per_leaf = 5000", "persons_per_leaf = 0"),
    "root-code-empty": lambda t: t.replace('root_code = "CL"', 'root_code = ""'),
    "not-toml": lambda t: t + "\n[census\n",
}


def declarations() -> list[Case]:
    cases = []
    for edit, fn in DECLARATION_EDITS.items():
        if edit.startswith("synth-"):
            continue  # the synth section is read by `topdown synth` alone (below)
        klass = "silent" if edit in ("two-levels-one-value", "synth-weights-negative") else "crash"
        cases.append(Case(klass, "privacy/chile", f"declaration-{edit}", ("privacy", "c.toml"), EXIT_CONFIG,
                          ("mine.toml",), setup=_declaration(fn), timeout=60))
    for edit in ("two-levels-one-value", "size-huge", "synth-weights-negative", "synth-nodes-zero",
                 "synth-weights-wrong-length", "synth-persons-per-leaf-zero", "duplicate-attribute", "not-toml"):
        cases.append(Case("silent" if edit != "not-toml" else "crash", "synth/chile", f"declaration-{edit}",
                          ("synth", "--census", "mine.toml", "--persons", "100", "out"), EXIT_CONFIG, ("mine.toml",),
                          setup=_declaration(DECLARATION_EDITS[edit]), timeout=60))
    return cases


# ------------------------------------------------------------------------------------------------- hangs
def hangs() -> list[Case]:
    unbounded = {
        "synth:persons": ("synth", "--census", "chile_2017", "--persons", "99999999999999", "out"),
        "synth:blocks": ("synth", "--blocks", "99999999999", "out"),
        "synth:scale": ("synth", "--shape", "us2020", "--scale", "1e300", "out"),
        "synth:states-and-blocks": ("synth", "--blocks", "10000000", "--states", "52", "--persons", "999999999999",
                                    "out"),
        "replicates:n": ("replicates", "{run}", "--n", "100000000000000000000", "--out", "reps"),
        "replicates/chile:n": ("replicates", "{crun}", "--n", "1e20", "--out", "reps"),
        "replicates:parallel": ("replicates", "{run}", "--n", "1", "--parallel", "99999999", "--out", "reps"),
        "audit:runs": ("audit", "demo", "--input", "{input}", "--move", MOVE, "--runs", "99999999999", "--out", "a"),
        "run:workers": ("run", "demo", "--input", "{input}", "--out", "out", "--workers", "100000"),
        "run/chile:workers": ("run", "{cconf}", "--input", "{cinput}", "--out", "out", "--workers", "99999"),
        "reprocess:workers": ("reprocess", "{run}", "--out", "out", "--workers", "100000"),
        "uncertainty:workers": ("uncertainty", "{run}", "--out", "u.parquet", "--workers", "100000"),
        "evaluate:workers": ("evaluate", "{run}", "--truth", "{input}", "--out", "ev", "--workers", "100000"),
        "uncertainty/chile:levels-many": ("uncertainty", "{crun}", "--out", "u.parquet", "--levels",
                                          *[f"L{i}" for i in range(200)]),
    }
    cases = [Case("hang", k.split(":")[0], k.split(":")[1], argv, EXIT_CONFIG, timeout=60)
             for k, argv in unbounded.items()]
    cases.append(Case("hang", "batch", "wait-forever", ("batch", "jobs.toml", "--wait", "1e308"), EXIT_CONFIG,
                      ("--wait",), setup=_jobs("fine"), timeout=60))
    cases.append(Case("hang", "run", "scheduler-unreachable", ("run", "demo", "--input", "{input}", "--out", "out",
                                                               "--scheduler", "tcp://127.0.0.1:9"),
                      EXIT_CONFIG, ("tcp://127.0.0.1:9", "within 3s"), timeout=120, env=SHORT_CONNECT))
    cases.append(Case("hang", "run", "scheduler-garbage", ("run", "demo", "--input", "{input}", "--out", "out",
                                                           "--scheduler", "not a url"), EXIT_CONFIG,
                      ("not a url",), timeout=120))
    return cases


# ---------------------------------------------------------------------------------------------- two writers
def two_writers() -> list[Case]:
    cases = []
    for key, argv in WRITERS.items():
        command = _command(key)
        setup = files(**{"out__.lock": lock_text(), "out__" + (".topdown-output.json" if command not in
                                                              ("run", "reprocess") else "manifest.json"):
                         marker(command, status="running") if command in ("run", "reprocess") else marker(command)})
        cases.append(Case("two-writers", key, "locked-by-a-live-process", with_out(argv, "{tmp}/out"), EXIT_RUNDIR,
                          ("locked", "pid 1"), setup=setup))
    for key, argv in FILE_WRITERS.items():
        name = "u.parquet" if key.startswith("uncertainty") else "c.json"
        cases.append(Case("two-writers", key, "locked-by-a-live-process", with_out(argv, "{tmp}/" + name),
                          EXIT_RUNDIR, ("locked", "pid 1"), setup=files(**{f".{name}.lock": lock_text()})))
    cases.append(Case("two-writers", "batch", "locked-by-a-live-process", ("batch", "jobs.toml"), EXIT_RUNDIR,
                      ("pid 1",), setup=both(_jobs("fine"), files(**{"jobs.logs__.lock": lock_text()}))))
    return cases


# ------------------------------------------------------------------------------------- silent acceptance
def _run_copy_edit(edit: Callable[[Path], None]) -> Setup:
    """A copy of the Chilean run, ``run`` in the case's folder, edited."""
    def make(tmp: Path, fields: dict) -> None:
        import shutil

        shutil.copytree(fields["crun"], tmp / "run")
        edit(tmp / "run")
    return make


def _drop_sums(level: str) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        manifest = json.loads((run / "manifest.json").read_text())
        del manifest["sha256"]["persons"][level]
        (run / "manifest.json").write_text(json.dumps(manifest))
    return edit


def _first(run: Path, pattern: str) -> Path:
    return sorted(run.glob(pattern))[0]


def _truncate(pattern: str) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        f = _first(run, pattern)
        f.write_bytes(f.read_bytes()[:100])
    return edit


def _append(pattern: str) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        with open(_first(run, pattern), "ab") as fh:
            fh.write(b"\0")
    return edit


def _remove(pattern: str) -> Callable[[Path], None]:
    return lambda run: _first(run, pattern).unlink()


def _manifest_set(key: str, value) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        manifest = json.loads((run / "manifest.json").read_text())
        manifest[key] = value
        (run / "manifest.json").write_text(json.dumps(manifest))
    return edit


RUN_DAMAGE: dict[str, Callable[[Path], None]] = {
    "sums-of-a-level-removed": _drop_sums("District"),
    "histogram-truncated": _truncate("histograms/persons/level=Commune/*.parquet"),
    "histogram-byte-appended": _append("histograms/persons/level=Region/*.parquet"),
    "measurement-removed": _remove("noisy_measurements/persons/level=Province/*.parquet"),
    "measurement-truncated": _truncate("noisy_measurements/persons/level=Nation/*.parquet"),
    "mdf-truncated": _truncate("mdf/persons/*.parquet"),
    "stray-file": lambda run: (run / "histograms" / "notes.txt").write_text("x"),
    "stray-hidden-file": lambda run: (run / ".hidden").write_text("x"),
    "certificate-edited": lambda run: (run / "certificate.json").write_text(
        (run / "certificate.json").read_text().replace('"private"', '"privat"')),
    "config-edited": lambda run: (run / "config.json").write_text("{}"),
    "manifest-not-json": lambda run: (run / "manifest.json").write_text("{not json"),
    "manifest-a-list": lambda run: (run / "manifest.json").write_text("[]"),
    "manifest-status-unknown": _manifest_set("status", "finished-ish"),
    "manifest-levels-not-names": _manifest_set("levels", [1, 2, None]),
    "manifest-levels-unknown": _manifest_set("levels", ["Nation", "Atlantis"]),
    "manifest-schema-future": _manifest_set("schema_version", 999),
    "manifest-sha-not-a-map": _manifest_set("sha256", ["a"]),
    "spine-removed": lambda run: (run / "spine.parquet").unlink(),
    "invariants-emptied": lambda run: (run / "invariants" / "persons.parquet").write_bytes(b""),
}
#: What verify must say of each damage: exit 1 (a check failed) or 4 (not a run it can read).
VERIFY_CODES = {"manifest-not-json": EXIT_RUNDIR, "manifest-a-list": EXIT_RUNDIR,
                "manifest-status-unknown": EXIT_RUNDIR, "manifest-levels-not-names": EXIT_RUNDIR,
                "manifest-levels-unknown": EXIT_RUNDIR,
                "manifest-schema-future": EXIT_RUNDIR, "manifest-sha-not-a-map": EXIT_RUNDIR}


def _csv(text: str) -> Setup:
    return files(**{"b.csv": text})


HEADER = "GEOID,pop,vap," + ",".join(f"pop_{g},vap_{g}" for g in ("white", "black", "aian", "asian", "nhpi", "other",
                                                                   "two", "hisp"))


def silent() -> list[Case]:
    cases = []
    for damage, edit in RUN_DAMAGE.items():
        cases.append(Case("silent", "verify/chile", damage, ("verify", "{tmp}/run"),
                          VERIFY_CODES.get(damage, EXIT_VERIFY), setup=_run_copy_edit(edit)))
    for damage in ("sums-of-a-level-removed", "measurement-truncated", "measurement-removed",
                   "manifest-levels-not-names", "manifest-not-json"):  # what nmf and uncertainty read
        for command, argv in (("nmf", READERS["nmf"]), ("uncertainty", READERS["uncertainty"])):
            code = EXIT_RUNDIR
            cases.append(Case("silent", f"{command}/chile", damage, argv, code, setup=_run_copy_edit(RUN_DAMAGE[damage])))
    cases += [
        Case("silent", "ingest/blocks", "header-only-csv", ("ingest", "blocks", "b.csv", "--out", "out"), EXIT_INPUT,
             ("b.csv",), setup=_csv(HEADER + "\n")),
        Case("silent", "ingest/blocks", "empty-csv", ("ingest", "blocks", "b.csv", "--out", "out"), EXIT_INPUT,
             ("b.csv",), setup=_csv("")),
        Case("silent", "ingest/blocks", "negative-count", ("ingest", "blocks", "b.csv", "--out", "out"), EXIT_INPUT,
             ("b.csv",), setup=_csv(HEADER + "\n440070001001001,-5,-5,-5,-5" + ",0" * 14 + "\n")),
        Case("silent", "ingest/blocks", "adults-above-persons", ("ingest", "blocks", "b.csv", "--out", "out"),
             EXIT_INPUT, ("b.csv",), setup=_csv(HEADER + "\n440070001001001,5,9,5,9" + ",0" * 14 + "\n")),
        Case("silent", "ingest/blocks", "fractional-count", ("ingest", "blocks", "b.csv", "--out", "out"),
             EXIT_INPUT, ("b.csv",), setup=_csv(HEADER + "\n440070001001001,2.5,2.5,2.5,2.5" + ",0" * 14 + "\n")),
        Case("silent", "ingest/blocks", "duplicate-geoid", ("ingest", "blocks", "b.csv", "--out", "out"), EXIT_INPUT,
             ("b.csv",), setup=_csv(HEADER + ("\n440070001001001,5,5,5,5" + ",0" * 14) * 2 + "\n")),
        Case("silent", "ingest/blocks", "race-sum-differs", ("ingest", "blocks", "b.csv", "--out", "out"),
             EXIT_INPUT, ("b.csv",), setup=_csv(HEADER + "\n440070001001001,5,5,3,3" + ",0" * 14 + "\n")),
        Case("silent", "ingest/blocks", "huge-count", ("ingest", "blocks", "b.csv", "--out", "out"), EXIT_INPUT,
             ("b.csv",), setup=_csv(HEADER + "\n440070001001001" + ",99999999999999999999" * 4 + ",0" * 14 + "\n")),
        Case("silent", "ingest/pl94", "a-file-not-a-folder", ("ingest", "pl94", "b.csv", "--out", "out"), EXIT_INPUT,
             ("b.csv",), setup=_csv(HEADER + "\n")),
        Case("silent", "ingest/pl94", "empty-folder", ("ingest", "pl94", "src", "--out", "out"), EXIT_INPUT,
             ("src",), setup=files(src=None)),
        Case("silent", "synth/chile", "persons-negative", ("synth", "--census", "chile_2017", "--persons", "-3", "o"),
             EXIT_CONFIG, ("--persons",)),
        Case("silent", "synth", "blocks-negative", ("synth", "--blocks", "-3", "o"), EXIT_CONFIG, ("--blocks",)),
        Case("silent", "synth", "persons-without-census-or-blocks", ("synth", "--persons", "0", "o"), EXIT_CONFIG,
             ("--persons",)),
        Case("silent", "spine", "baf-folder-empty", ("spine", "--baf", "baf", "--out", "out"), EXIT_INPUT, ("baf",),
             setup=files(baf=None)),
        Case("silent", "spine", "baf-header-only", ("spine", "--baf", "baf", "--out", "out"), EXIT_INPUT,
             ("BlockAssign",), setup=files(**{"baf__BlockAssign_ST44_RI_AIANNH.txt": "BLOCKID|AIANNHCE|COMPTYP\n"})),
        Case("silent", "evaluate", "truth-of-another-census", ("evaluate", "{run}", "--truth", "{cinput}", "--out",
                                                               "ev"), EXIT_INPUT),
        Case("silent", "evaluate/chile", "truth-of-another-census", ("evaluate", "{crun}", "--truth", "{input}",
                                                                     "--out", "ev"), EXIT_INPUT),
        Case("silent", "run/chile", "us-input-for-chile", ("run", "{cconf}", "--input", "{input}", "--out", "out",
                                                           "--workers", "1"), EXIT_INPUT),
        Case("silent", "run", "chile-input-for-us", ("run", "demo", "--input", "{cinput}", "--out", "out",
                                                     "--workers", "1"), EXIT_INPUT),
        Case("silent", "uncertainty", "levels-unknown", ("uncertainty", "{run}", "--levels", "Atlantis", "--out",
                                                         "u.parquet"), EXIT_CONFIG, ("Atlantis",)),
        Case("silent", "uncertainty/chile", "levels-of-the-us", ("uncertainty", "{crun}", "--levels", "Block",
                                                                 "--out", "u.parquet"), EXIT_CONFIG, ("Block",)),
        Case("silent", "audit", "move-to-same-block", ("audit", "demo", "--input", "{input}", "--move",
                                                       "440070001001001:440070001001001", "--runs", "1", "--out",
                                                       "a"), EXIT_CONFIG, ("--move",)),
        Case("silent", "audit", "move-from-unknown-block", ("audit", "demo", "--input", "{input}", "--move",
                                                            "449990001001001:440070001001001", "--runs", "1",
                                                            "--out", "a"), EXIT_CONFIG, ("449990001001001",)),
        Case("silent", "audit", "move-malformed", ("audit", "demo", "--input", "{input}", "--move", "nonsense",
                                                   "--runs", "1", "--out", "a"), EXIT_CONFIG, ("--move",)),
        Case("silent", "audit", "queries-unknown", ("audit", "demo", "--input", "{input}", "--move", MOVE,
                                                    "--runs", "1", "--queries", "nosuch", "--out", "a"),
             EXIT_CONFIG, ("nosuch",)),
        Case("silent", "audit", "queries-empty", ("audit", "demo", "--input", "{input}", "--move", MOVE, "--runs",
                                                  "1", "--queries", "", "--out", "a"), EXIT_CONFIG, ("--queries",)),
        Case("silent", "reprocess", "spine-without-nmf", ("reprocess", "{run}", "--spine", "{crun}/spine.parquet",
                                                          "--out", "out"), EXIT_CONFIG, ("--spine",)),
        Case("silent", "uncertainty/chile", "spine-without-nmf", ("uncertainty", "{crun}", "--spine",
                                                                  "{crun}/spine.parquet", "--out", "u.parquet"),
             EXIT_CONFIG, ("--spine",)),
        Case("silent", "uncertainty/chile", "config-without-nmf", ("uncertainty", "{crun}", "--config", "{cconf}",
                                                                   "--out", "u.parquet"), EXIT_CONFIG, ("--config",)),
        Case("silent", "evaluate", "same-run-twice", ("evaluate", "{run}", "{run}", "--truth", "{input}", "--out",
                                                      "ev"), EXIT_CONFIG, ("twice",)),
        Case("silent", "run", "resume-and-force", ("run", "demo", "--input", "{input}", "--out", "out", "--resume",
                                                   "--force"), EXIT_CONFIG, ("--resume", "--force")),
    ]
    return cases


# ------------------------------------------------------------------------------------------------- corners
def _exact_invariant_interval(tmp: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(tmp / "u.parquet").to_pandas()
    nation = table[(table["level"] == "Nation") & (table["query"] == "total")]
    assert len(nation) == 1, nation
    row = nation.iloc[0]
    lo = [c for c in table.columns if c.startswith("lower")] or [c for c in table.columns if "lo" in c]
    hi = [c for c in table.columns if c.startswith("upper")] or [c for c in table.columns if "hi" in c]
    assert lo and hi, table.columns
    for a, b in zip(lo, hi):
        assert row[a] == row[b], row  # an exact invariant: the degenerate interval [v, v]
        assert row[a] <= row["estimate"] + 1e-6 and row[b] >= row["estimate"] - 1e-6, row


def corners() -> list[Case]:
    return [
        Case("corner", "uncertainty/chile", "exact-invariant-interval", ("uncertainty", "{crun}", "--out",
                                                                         "{tmp}/u.parquet", "--workers", "1"),
             EXIT_OK, writes=True, check=_exact_invariant_interval, timeout=300),
        Case("corner", "ingest/pl94", "a-file-is-an-input-error", ("ingest", "pl94", "f.pl", "--out", "out"),
             EXIT_INPUT, ("f.pl",), setup=files(**{"f.pl": "x|y\n"})),
        Case("corner", "run/chile", "level-names-of-the-census", ("run", "{cconf}", "--input", "bad", "--out", "out",
                                                                  "--workers", "1"), EXIT_INPUT, ("distrito",),
             setup=_chile_input_missing_district),
        Case("corner", "run/chile", "config-error-before-input", ("run", "c.toml", "--input", "nosuch", "--out", "out",
                                                                  "--workers", "1"), EXIT_CONFIG, ("c.toml",),
             setup=_config(BASES["chile"] + '[persons.budget]\nrho = "-1"\n')),
        Case("corner", "privacy/chile", "leaf-total-where-invariant", ("privacy", "c.toml"), EXIT_OK,
             setup=_config('include = "chile_2017.toml"\n[persons.invariants]\nDistrict = ["tot"]\n'
                           '[persons.constraints]\nDistrict = ["total", "under15_no_marital_status", '
                           '"over15_marital_status"]\n' + "".join(f'{lv} = ["total"]\n' for lv in
                                                                    ("Nation", "Region", "Province", "Commune")))),
        Case("corner", "verify", "a-file-not-a-run", ("verify", "f"), EXIT_RUNDIR, ("f",), setup=files(f="x")),
        Case("corner", "privacy", "json-to-stdout", ("privacy", "{cconf}", "--json"), EXIT_OK),
        Case("corner", "privacy", "infinite-budget-in-production", ("privacy", "c.toml"), EXIT_CONFIG, ("c.toml",),
             setup=_config('include = "demo.toml"\n[run]\nmode = "production"\nseed = 1\n[persons.budget]\n'
                           'rho = "inf"\n'.replace("seed = 1\n", ""))),
    ]


def _chile_input_missing_district(tmp: Path, fields: dict) -> None:
    import pandas as pd

    source = Path(fields["cinput"])
    for part in source.rglob("*.parquet"):
        frame = pd.read_parquet(part).drop(columns=["distrito"])
        dest = tmp / "bad" / part.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(dest)


# ------------------------------------------------------------------------------------------------ the API
#: Python API calls (run in a subprocess by tests/cli_subprocess.py's ``api``), their exception mapped to the
#: command line's exit codes; ``{name}`` fields as on a command line.
API = {
    "load_config-missing": ("from topdown.pipeline import load_config; load_config('{tmp}/nosuch.toml')",
                            EXIT_CONFIG, None),
    "load_config-not-toml": ("from topdown.pipeline import load_config; load_config('{tmp}/c.toml')", EXIT_CONFIG,
                             _config("[run\n")),
    "load_config-deep": ("from topdown.pipeline import load_config; load_config('{tmp}/c.toml')", EXIT_CONFIG,
                         _config(DEEP)),
    "load_config-fifo": ("from topdown.pipeline import load_config; load_config('{tmp}/fifo')", EXIT_CONFIG,
                         files(fifo="FIFO")),
    "load_config-int": ("from topdown.pipeline import load_config; load_config(5)", EXIT_CONFIG, None),
    "load_config-none": ("from topdown.pipeline import load_config; load_config(None)", EXIT_CONFIG, None),
    "load_config-chile-bad-rho": ("from topdown.pipeline import load_config; load_config('{tmp}/c.toml')",
                                  EXIT_CONFIG, _config(BASES["chile"] + '[persons.budget]\nrho = "1e-5000"\n')),
    "with_overrides-negative-seed": ("from topdown.pipeline import load_config; "
                                     "load_config('demo').with_overrides(seed=-1)", EXIT_CONFIG, None),
    "with_overrides-unknown": ("from topdown.pipeline import load_config; "
                               "load_config('demo').with_overrides(nosuch=1)", EXIT_CONFIG, None),
    "run-user-folder": ("from topdown.pipeline import run; run('demo', '{tmp}/mine', input_dir='{input}', "
                        "workers=1)", EXIT_RUNDIR, files(**USER)),
    "run-inside-a-run": ("from topdown.pipeline import run; run('demo', '{run}/extra', input_dir='{input}', "
                         "workers=1)", EXIT_RUNDIR, None),
    "run-missing-input": ("from topdown.pipeline import run; run('{cconf}', '{tmp}/out', input_dir='{tmp}/nosuch',"
                          " workers=1)", EXIT_INPUT, None),
    "run-chile-us-input": ("from topdown.pipeline import run; run('{cconf}', '{tmp}/out', input_dir='{input}', "
                           "workers=1)", EXIT_INPUT, None),
    "run-workers-negative": ("from topdown.pipeline import run; run('demo', '{tmp}/out', input_dir='{input}', "
                             "workers=-1)", EXIT_CONFIG, None),
    "run-workers-huge": ("from topdown.pipeline import run; run('demo', '{tmp}/out', input_dir='{input}', "
                         "workers=10**9)", EXIT_CONFIG, None),
    "run-config-not-a-config": ("from topdown.pipeline import run; run(42, '{tmp}/out', input_dir='{input}')",
                                EXIT_CONFIG, None),
    "submit-user-folder": ("from topdown.pipeline import submit; submit('demo', '{tmp}/mine', input_dir='{input}',"
                           " workers=1, progress=False).result()", EXIT_RUNDIR, files(**USER)),
    "submit_reprocess-not-a-run": ("from topdown.pipeline import submit_reprocess; submit_reprocess('{input}', "
                                   "'{tmp}/out', workers=1, progress=False).result()", EXIT_RUNDIR, None),
    "submit_uncertainty-user-file": ("from topdown.pipeline import submit_uncertainty; submit_uncertainty('{crun}',"
                                     " '{tmp}/mine.parquet', workers=1, progress=False).result()", EXIT_RUNDIR,
                                     files(**{"mine.parquet": "mine"})),
    "submit_replicates-n-zero": ("from topdown.pipeline import submit_replicates; submit_replicates('{crun}', 0, "
                                 "'{tmp}/reps', workers=1, progress=False).result()", EXIT_CONFIG, None),
    "submit_replicates-n-huge": ("from topdown.pipeline import submit_replicates; submit_replicates('{crun}', "
                                 "10**20, '{tmp}/reps', workers=1, progress=False).result()", EXIT_CONFIG, None),
    "write_nmf-inside-run": ("from topdown.pipeline.execution.nmf import write_nmf; write_nmf('{crun}', "
                             "'{crun}/nmf')", EXIT_RUNDIR, None),
    "write_nmf-user-folder": ("from topdown.pipeline.execution.nmf import write_nmf; write_nmf('{crun}', "
                              "'{tmp}/mine')", EXIT_RUNDIR, files(**USER)),
    "write_nmf-not-a-run": ("from topdown.pipeline.execution.nmf import write_nmf; write_nmf('{cinput}', "
                            "'{tmp}/nmf')", EXIT_RUNDIR, None),
    "verify_run-missing": ("from topdown.pipeline.outputs.verify import verify_run; verify_run('{tmp}/nosuch')",
                           EXIT_RUNDIR, None),
    "verify_run-a-file": ("from topdown.pipeline.outputs.verify import verify_run; verify_run('{tmp}/f')",
                          EXIT_RUNDIR, files(f="x")),
    "evaluate-into-run": ("from topdown.pipeline.evaluation.evaluate import evaluate; from pathlib import Path; "
                          "evaluate([Path('{crun}')], Path('{cinput}'), out=Path('{crun}/ev'))", EXIT_RUNDIR, None),
    "evaluate-user-folder": ("from topdown.pipeline.evaluation.evaluate import evaluate; from pathlib import Path; "
                             "evaluate([Path('{crun}')], Path('{cinput}'), out=Path('{tmp}/mine'))", EXIT_RUNDIR,
                             files(**USER)),
    "uncertainty-levels-unknown": ("from topdown.pipeline.evaluation.uncertainty import uncertainty; "
                                   "uncertainty('{crun}', '{tmp}/u.parquet', levels=['Block'], workers=1)",
                                   EXIT_CONFIG, None),
    "replicates-user-folder": ("from topdown.pipeline.evaluation.replicates import replicates; "
                               "replicates('{crun}', 1, '{tmp}/mine', workers=1)", EXIT_RUNDIR, files(**USER)),
    "ingest_blocks-header-only": ("from topdown.pipeline.inputs.ingest import ingest_blocks; from pathlib import "
                                  "Path; ingest_blocks(Path('{tmp}/b.csv'), Path('{tmp}/out'))", EXIT_INPUT,
                                  _csv(HEADER + "\n")),
    "ingest_blocks-user-folder": ("from topdown.pipeline.inputs.ingest import ingest_blocks; from pathlib import "
                                  "Path; ingest_blocks(Path('{blocks}'), Path('{tmp}/mine'))", EXIT_RUNDIR,
                                  files(**USER)),
    "write_demo_input-into-run": ("from topdown.pipeline.inputs.demo_data import write_demo_input; from pathlib "
                                  "import Path; write_demo_input(Path('{run}/input'))", EXIT_RUNDIR, None),
}


def _api_class(name: str) -> str:
    return ("data-loss" if "user" in name else "published-tree" if "inside" in name or "into" in name
            else "hang" if "huge" in name else "crash")


def api() -> list[Case]:
    return [Case(_api_class(name), "api", name, ("api", code), expected, setup=setup)
            for name, (code, expected, setup) in API.items()]


#: The cases that found a bug, by id: what was wrong (now fixed in the code).
FIXED: dict[str, str] = {
    "crash:ingest:blocks-source-device": "`ingest blocks /dev/zero` read without end (memory without bound); every "
                                         "path argument read is now a regular file or a folder (exit 2)",
    "crash:evaluate:truth-empty-string": "`--truth \"\"` was read as the current folder (exit 3 naming a relative "
                                         "persons.parquet); an empty path argument is now a usage error (exit 2)",
    "crash:uncertainty:entities-empty-string": "`--entities \"\"` was taken for no entities: exit 0, silently",
    "crash:spine:units-empty-string": "`--units \"\"` was taken for no units file: exit 0, silently",
    "crash:evaluate:workers=0": "`evaluate --workers 0` was taken for no cluster: exit 0; --workers is now checked "
                                "for every command in one place",
    "crash:audit:runs=99999999999999999999": "`audit --runs 99999999999999999999` ran without end; --runs is now "
                                             "1 to 10,000",
    "crash:privacy:name-slash": "`[run] name = \"../escape\"` was accepted; the name makes outputs' folders "
                                "(runs/<name>-audit-CONFIDENTIAL): it is now a name that stays in its folder",
    "crash:run:config-name-slash": "the same name accepted by `run` (exit 0)",
    "hang:run:scheduler-garbage": "`--scheduler \"not a url\"` was an internal error (exit 6, distributed's "
                                  "ValueError); the address is now checked to be host:port",
    "hang:replicates:parallel": "`replicates --parallel 99999999` was accepted; --parallel is now 1 to 1,000",
    "silent:spine:baf-header-only": "a block assignment file of a header alone gave \"the root level US must hold "
                                    "one node\", naming no file; it now names the file (no blocks)",
    "silent:reprocess:spine-without-nmf": "`reprocess RUN --spine FILE` ignored the spine silently (a run carries "
                                          "its own)",
    "silent:evaluate:same-run-twice": "`evaluate RUN RUN` counted one run as two replicates",
    "crash:api:load_config-int": "`load_config(5)` (or None) was a TypeError from deep inside (exit 6 through the "
                                 "command line's mapping); it is now a configuration error naming the argument",
    "crash:api:run-config-not-a-config": "`run(42, ...)`: a TypeError (exit 6), now a configuration error",
    "silent:run:resume-and-force": "`run --resume --force` was accepted; on a complete run it recomputed nothing",
    "silent:uncertainty/chile:spine-without-nmf": "`uncertainty RUN --spine FILE` (or --config) ignored it silently",
    "crash:synth:census-fifo": "`synth --census FIFO` said \"no such census declaration file\" of a file that "
                               "exists; --census is now checked as the other path arguments",
    "crash:privacy:rho-long-digits": "a 5,000-digit budget was refused with the whole number in the message; the "
                                     "value shown is now cut short",
    "crash:batch:wait=-1": "`batch --wait -1` was accepted (and `--wait nan` waited forever on a held lock); "
                           "--wait is now 0 to a week",
}
#: The cases of a problem still open, by id: why (run as strict xfail).
XFAIL: dict[str, str] = {}


def catalogue() -> list[Case]:
    """Every case, in a fixed order."""
    cases = (wrong_kinds() + numbers() + configurations() + declarations() + hangs() + silent() + escapes() + api()
             + corners() + standalone() + two_writers() + published_tree() + data_loss())
    ids = {c.id for c in cases}
    assert set(FIXED) <= ids and set(XFAIL) <= ids, (set(FIXED) | set(XFAIL)) - ids
    return [replace(c, fixed=FIXED.get(c.id, ""), xfail=XFAIL.get(c.id, "")) for c in cases]


SAMPLE_EVERY = 32


def sample(cases: list[Case]) -> set[str]:
    """The cases the default selection takes (marked ``smoke``): every 32nd of the catalogue; the rest are slow."""
    return {c.id for i, c in enumerate(cases) if i % SAMPLE_EVERY == 0}

