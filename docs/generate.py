"""The reference pages' generated parts, made from the code at every build (``docs/conf.py`` calls :func:`generate`).

A page holds a marker ``<!-- generate: NAME -->`` where the generated Markdown goes (:data:`GENERATORS`):
the command line from the argparse parser, the configuration keys from the pydantic models, the census
declaration's tables from the loader's key lists, the exit codes from the CLI's constants and the run
directory's layout from its module.
"""
from __future__ import annotations

import argparse
import re
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!--\s*generate:\s*([\w-]+)\s*-->")


def _cell(text: object) -> str:
    """Text for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# -- the command line -------------------------------------------------------------------------------------

def _flags(action: argparse.Action) -> str:
    if action.option_strings:
        value = f" {action.metavar or action.dest.upper()}" if action.nargs != 0 else ""
        return ", ".join(f"`{o}{value}`" for o in action.option_strings)
    return f"`{action.metavar or action.dest}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | meaning |", "| --- | --- | --- |"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        meaning = (action.help or "") % {"default": action.default, "prog": parser.prog} if action.help else ""
        if action.choices and not isinstance(action.choices, dict):
            meaning += f" (one of {', '.join(f'`{c}`' for c in action.choices)})"
        rows.append(f"| {_flags(action)} | {_default(action)} | {_cell(meaning)} |")
    return rows


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by name (``topdown NAME``)."""
    from topdown.pipeline.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def cli_reference() -> str:
    from topdown.pipeline.cli import EXAMPLES, build_parser

    out = ["Every command below is `topdown COMMAND`; `topdown --version` prints the version and `-v` before the "
           "command turns on debug logging.", ""]
    out += _arguments(build_parser()) + [""]
    for name, parser in commands().items():
        usage = parser.format_usage().replace("usage: ", "").strip()
        usage = re.sub(r"\s+", " ", usage)
        out += [f"## `{name}`", "", (parser.description or "").strip().rstrip(".") + ".", "", "```text", usage, "```",
                ""]
        out += _arguments(parser)
        out += ["", f"Example: `{EXAMPLES[name]}`", ""]
    return "\n".join(out)


# -- the run configuration ----------------------------------------------------------------------------------

def _type(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' for a in args)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type(a) for a in args if a is not type(None)) + (
            " or none" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type(args[1])}" if args else "table"
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return "table"
    name = getattr(annotation, "__name__", str(annotation))
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "Fraction": "fraction",
            "StrictStr": "string", "StrictInt": "integer", "StrictFloat": "number", "StrictBool": "boolean",
            }.get(name, name)


def _model_rows(model: type) -> list[str]:
    from pydantic_core import PydanticUndefined

    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, field in model.model_fields.items():
        if field.exclude:
            continue
        if field.default is not PydanticUndefined:
            default = "none" if field.default is None else "empty" if field.default in ([], {}) else f"`{field.default}`"
        elif field.default_factory is not None:
            default = "empty"
        else:
            default = "required"
        rows.append(f"| `{key}` | {_type(field.annotation)} | {_cell(default)} | {_cell(field.description or '')} |")
    return rows


def configuration_reference() -> str:
    from topdown.pipeline.configuration.config import (BudgetConfig, EstimationConfig, MatchPublished,
                                                        ProductConfig, RunSection)

    tables = [("[run]", RunSection, "what is run, on which input, in which mode"),
              ("[PRODUCT]", ProductConfig, "one table per product of the census (`persons`, `units`, ...)"),
              ("[PRODUCT.budget]", BudgetConfig, "the product's privacy budget"),
              ("[PRODUCT.estimation]", EstimationConfig, "how the product's histograms are estimated"),
              ("[PRODUCT.estimation.match_published]", MatchPublished,
               "a marginal held equal, at every level, to the counts an earlier run on the same spine published")]
    out = []
    for title, model, what in tables:
        out += [f"## `{title}`", "", f"{what[0].upper()}{what[1:]}.", ""] + _model_rows(model) + [""]
    return "\n".join(out)


# -- the census declaration -------------------------------------------------------------------------------------

def census_reference() -> str:
    from topdown.pipeline.configuration import census as loader
    from topdown.vocab.census import CONSTRAINT_RHS, INVARIANT_KINDS

    out = ["| table | its keys |", "| --- | --- |"]
    for table, keys in loader.DECLARATION_KEYS.items():
        out.append(f"| `[{table}]` | {', '.join(f'`{k}`' for k in keys)} |")
    out += ["", "| vocabulary | values |", "| --- | --- |",
            f"| invariant kinds | {', '.join(f'`{k}`' for k in INVARIANT_KINDS)} |",
            f"| constraint right-hand sides | {', '.join(f'`{k}`' for k in CONSTRAINT_RHS)} |",
            f"| constraint senses | {', '.join(f'`{k}`' for k in loader.SENSES)} |",
            f"| MDF layouts (`mdf`) | {', '.join(f'`{k}`' for k in loader.MDF_LAYOUTS)} |",
            f"| shipped declarations (`conf/census/`) | {', '.join(f'`{k}`' for k in loader.census_presets())} |"]
    return "\n".join(out)


# -- exit codes and the run directory --------------------------------------------------------------------------

def exit_codes_reference() -> str:
    from topdown.pipeline import cli

    codes = sorted((value, name) for name, value in vars(cli).items() if name.startswith("EXIT_") and isinstance(value, int))
    meanings = dict(re.findall(r"(\d+) ([^;,]+)", cli.EXIT_CODES_HELP.split(":", 1)[1]))
    out = ["| exit code | constant | meaning (as `--help` states it) |", "| --- | --- | --- |"]
    for value, name in codes:
        meaning = meanings.get(str(value), "")
        meaning = f"interrupted {meaning}" if meaning.startswith("by ") else meaning  # "130 interrupted by ..., 143 by ..."
        out.append(f"| {value} | `{name}` | {_cell(meaning)} |")
    return "\n".join(out)


def run_layout_reference() -> str:
    from topdown.pipeline.runtime import rundir

    doc = rundir.__doc__ or ""
    listing = doc.split("::", 1)[1].split("\n\n", 2)[1]
    return "```text\n" + "\n".join(line[4:] for line in listing.splitlines()) + "\n```"


def presets() -> str:
    from topdown.pipeline.configuration.config import preset_names

    return ", ".join(f"`{name}`" for name in preset_names())


GENERATORS = {"cli": cli_reference, "presets": presets, "configuration": configuration_reference,
              "census": census_reference, "exit-codes": exit_codes_reference, "run-layout": run_layout_reference}


def generate(markdown: str) -> str:
    """``markdown`` with each marker replaced by its generated text (an unknown name is an error)."""
    def one(m: re.Match) -> str:
        if m.group(1) not in GENERATORS:
            raise ValueError(f"unknown generated section {m.group(1)!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[m.group(1)]()
    return MARKER.sub(one, markdown)
