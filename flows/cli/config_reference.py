"""The configuration reference, docs/configuration.md, generated from the config dataclasses: every
key of every recipe kind (flows/config.py ``SCHEMAS``), its type, its default and the docstring
under its field. ``python -m flows.cli.config_reference`` rewrites the page; tests/flows/
test_config_reference.py fails when the page is not what this writes, so a key added to a
dataclass and missing from the page fails CI."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from typing import Any

from bloomline.config import field_docs, is_location, members, to_dict
from flows.config import REPO, SCHEMAS

PAGE = REPO / "docs" / "configuration.md"

KINDS = {
    "data": "`bloomline prepare --config` (and a pipeline's `data:`)",
    "model": "a training recipe's `model:` (by name, or its keys)",
    "train": "`bloomline train --config` (and a pipeline's `train:`)",
    "eval": "`bloomline evaluate --config` (and a training recipe's `evaluation.settings:`)",
    "pipeline": "`bloomline pipeline --config`",
}

INTRO = """# Configuration reference

Every key of every recipe, with its type, its default and what it does. Generated from the config
dataclasses by `python -m flows.cli.config_reference` (a test fails when this page is not what it
writes). Back to the [README](../README.md).

A recipe is a YAML file whose keys are these; a key left out takes its default. `-o key=value` on
the command line sets any key (the value is YAML: `-o pack.buckets=[128,256]`), checked as a value
in the file would be; `-o key=@FILE` reads the value from a YAML file (`-o
filters.languages=@thresholds.yaml`). An unknown key, a value of the wrong type or out of range is one line naming
the key.

**Paths.** A relative path written in a recipe file is relative to that file's folder, so the
recipe means the same from any directory; a relative path given with `-o`, like a command's own
arguments, is relative to the current directory. URLs (`s3://`, `gs://`, `hf://`, `https://`) and
absolute paths are taken as they are. A model recipe is named (`model: bloom-560m`, looked up in
`configs/model/`) or given by its keys.
"""


def _type(tp: Any) -> str:
    if is_location(tp) and any(dataclasses.is_dataclass(m) for m in members(tp)):
        return "a recipe's name or file, or mapping"
    if is_location(tp):
        rest = [m for m in members(tp) if m not in (str, type(None))]
        return (
            "path or URL" + "".join(f" or {_type(m)}" for m in rest) + (" or null" if type(None) in members(tp) else "")
        )
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " / ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return f"list of {_type(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_type(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if tp is type(None):
        return "null"
    return {str: "string", int: "integer", float: "number", bool: "true / false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(below)"
    else:
        return "required"
    return "`" + json.dumps(to_dict(value), ensure_ascii=False) + "`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rows(cls: type, prefix: str = "", own: dict[type, str] | None = None) -> list[str]:
    """One table row per key of ``cls`` (dotted from ``prefix``), nested dataclasses expanded
    except the recipe kinds documented in their own section (``own``: class → section link)."""
    own = own or {}
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, tp = prefix + f.name, hints[f.name]
        inner = [m for m in members(tp) if dataclasses.is_dataclass(m)]
        items = [typing.get_args(m)[0] for m in members(tp) if typing.get_origin(m) in (list, tuple)]
        nested = inner or [i for i in items if dataclasses.is_dataclass(i)]
        doc = docs.get(f.name, "")
        if nested and nested[0] in own and nested[0] is not cls:
            doc += f" Its keys: {own[nested[0]]}."
        default = "(its own)" if nested and nested[0] in own and _default(f) == "(below)" else _default(f)
        out.append(f"| `{key}` | {_cell(_type(tp))} | {_cell(default)} | {_cell(doc)} |")
        if nested and nested[0] not in own:
            out += rows(nested[0], key + ("[]." if not inner else "."), own)
    return out


def page() -> str:
    """The whole reference page."""
    own = {cls: f"[{kind}](#{kind})" for kind, cls in SCHEMAS.items()}
    parts = [INTRO]
    for kind, cls in SCHEMAS.items():
        parts += [
            f"## {kind}",
            "",
            f"`configs/{kind}/`, read by {KINDS[kind]}: `{cls.__module__}.{cls.__name__}`.",
            "",
            "| key | type | default | what it does |",
            "|---|---|---|---|",
            *rows(cls, "", {c: link for c, link in own.items() if c is not cls}),
            "",
        ]
    return "\n".join(parts)


def main() -> int:
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
