"""YAML recipes → typed, validated config dataclasses.

A recipe is a YAML file whose keys mirror a tree of dataclasses (litgpt-style: one dataclass
per component, a docstring under every field). Loading is strict:

* an unknown key is an error that names the key and suggests the closest known one;
* a value of the wrong type is an error that names the key and the expected type;
* each dataclass may define ``validate()`` for range/consistency checks and raise
  :class:`ConfigError` with the key relative to itself; the loader prefixes the parent path.

``-o dotted.key=value`` overrides are applied to the raw YAML tree before validation, so an
override is checked exactly like a value in the file. The value is parsed as YAML
(``-o pack.buckets=[128,256]``, ``-o tokenizer.model=null``).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, TypeVar, Union, get_args, get_origin

import yaml

from bloomline.errors import ConfigError

T = TypeVar("T")

LOCATION = "bloomline.location"
Location = Annotated[str, LOCATION]
"""The type of every setting that names a path or a URL (a file, a folder, a bucket): a string to
the loader; flows/run/served.py finds each by this type and checks what a served run may name."""


def is_location(tp: Any) -> bool:
    """Whether a field's annotation is a :data:`Location` (alone, optional, or in a union)."""
    if get_origin(tp) is Annotated:
        return LOCATION in get_args(tp)[1:] or is_location(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return any(is_location(a) for a in get_args(tp))
    return False


def members(tp: Any) -> list[Any]:
    """``tp``'s alternatives (a Union's members; an Annotated type's base), else ``[tp]``."""
    if get_origin(tp) is Annotated:
        return members(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [m for a in get_args(tp) for m in members(a)]
    return [tp]


def map_locations(tp: Any, node: Any, fn: Callable[[str], str]) -> Any:
    """``node`` (a recipe's raw value of annotation ``tp``: a mapping for a dataclass) with ``fn``
    applied to each string set in a :data:`Location` field, in lists and mappings too. A field that
    also takes a dataclass (``model: bloom-560m``) holds a recipe's name, not a path: left alone."""
    kinds = members(tp)
    if isinstance(node, str):
        return fn(node) if is_location(tp) and not any(dataclasses.is_dataclass(m) for m in kinds) else node
    if isinstance(node, dict):
        cls = next((m for m in kinds if dataclasses.is_dataclass(m)), None)
        if cls is not None:
            hints = typing.get_type_hints(cls, include_extras=True)
            return {k: map_locations(hints.get(str(k), Any), v, fn) for k, v in node.items()}
        values = [get_args(m)[1] for m in kinds if get_origin(m) is dict]
        return {k: map_locations(values[0] if values else Any, v, fn) for k, v in node.items()}
    if isinstance(node, list):
        items = [get_args(m)[0] for m in kinds if get_origin(m) in (list, tuple)]
        return [map_locations(items[0] if items else Any, v, fn) for v in node]
    return node


def against(base: Path) -> Callable[[str], str]:
    """A relative local path made absolute against ``base``; a URL, an absolute path or "" as is."""

    def resolve(v: str) -> str:
        return v if not v or "://" in v or Path(v).is_absolute() else str((base / v).resolve())

    return resolve


def _against_cwd(override: str) -> str:
    key, _, value = override.partition("=")
    return f"{key}={against(Path.cwd())(value.strip())}"


def recipe_of(cls: type) -> Any:
    """The annotation of a flow parameter holding recipe ``cls`` as a plain mapping (what Prefect
    passes): ``dict[str, Any]`` to Prefect, ``cls`` to flows/run/served.py."""
    return Annotated[dict[str, Any], cls]


def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Load ``path`` (or the dataclass defaults when None), apply overrides, validate."""
    raw: dict[str, Any] = {}
    base_dir = Path.cwd()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("", f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError("", f"{path}: not valid YAML: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError("", f"{path}: the top level must be a mapping of keys")
        base_dir = path.resolve().parent
    if hasattr(cls, "expand_raw"):  # e.g. a training recipe naming its model recipe
        # a section's recipe given with -o (-o train.recipe=configs/train/bloom-1b7.yaml) is read
        # before the section's other values are laid over it, as one written in the file is
        overrides = list(overrides)
        sections = [o for o in overrides if o.partition("=")[0].strip().split(".")[-1] == "recipe"]
        raw = apply_overrides(raw, [_against_cwd(o) for o in sections])
        overrides = [o for o in overrides if o not in sections]
        raw = cls.expand_raw(raw, base_dir)
    # The one path rule (docs/configuration.md): a relative path written in a recipe file is
    # relative to that file's folder, so the recipe means the same from any directory; one given
    # with -o is relative to the current directory, as a command's own arguments are.
    raw = map_locations(cls, raw, against(base_dir))
    raw = map_locations(cls, apply_overrides(raw, overrides), against(Path.cwd()))
    cfg = from_dict(cls, raw)
    if hasattr(cfg, "resolve_paths"):  # what else a recipe names by path (a model recipe)
        cfg.resolve_paths(base_dir)
    return cfg


def _override_value(key: str, text: str) -> Any:
    """An override's value: ``text`` parsed as YAML, or with ``@FILE`` that YAML file's content
    (relative to the current directory: ``-o filters.languages=@thresholds.yaml``)."""
    if text.startswith("@") and len(text) > 1:  # "@" cannot start a plain YAML scalar
        path = Path(text[1:])
        try:
            return yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ConfigError(
                key, f"{path}: {e.strerror} (a value given as @FILE is read from that YAML file)"
            ) from None
        except yaml.YAMLError as e:
            raise ConfigError(key, f"{path}: not valid YAML: {e}") from None
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``a.b.c=value`` applied (value parsed as YAML, or read
    from a YAML file given as ``@FILE``)."""
    import copy

    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("", f"override '{item}' is not of the form dotted.key=value")
        value = _override_value(key, text)
        node = raw
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(
                    ".".join(parts[: i + 1]), f"cannot set '{key}': this key holds a value, not a section"
                )
            node = nxt
        node[parts[-1]] = value
    return raw


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, strictly (see module docstring)."""
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping of keys, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(str(k), list(fields), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(fields)})"
        raise ConfigError(_join(path, str(k)), f"unknown key{hint}")
    kwargs = {name: _convert(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        obj = cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(_join(path, e.key), e.message) from None
    if hasattr(obj, "validate"):
        try:
            obj.validate()
        except ConfigError as e:
            raise ConfigError(_join(path, e.key), e.message) from None
    return obj


def to_dict(obj: Any) -> Any:
    """A plain (YAML/JSON-serialisable) copy of a config tree."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (litgpt style)."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:]):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = inspect.cleandoc(node.value.value)
    return docs


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path and key else (path or key)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_type_name(get_args(tp)[1])}"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    """``value`` as type ``tp`` (a config field's annotation); ConfigError naming ``path`` otherwise."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _convert_union(tp, value, path)
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise ConfigError(path, f"expected {_type_name(tp)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {value!r}")
        (item_tp, *_) = get_args(tp)
        return [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        key_tp, val_tp = get_args(tp)
        return {_convert(key_tp, k, path): _convert(val_tp, v, _join(path, str(k))) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value if value is not None else {}, path)
    if tp is Any:
        return value
    return _convert_scalar(tp, value, path)


def _convert_union(tp: Any, value: Any, path: str) -> Any:
    """``value`` as the first member of union ``tp`` that takes it (None where the union allows
    null); a member's own error when only one member is not null."""
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    if isinstance(value, dict):
        # a mapping can only be meant as the dataclass: report that branch's own error
        for arg in args:
            if dataclasses.is_dataclass(arg):
                return _convert(arg, value, path)
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value, path)
        except ConfigError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    raise ConfigError(path, f"expected {_type_name(tp)}, got {value!r}")


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _convert_scalar(tp: Any, value: Any, path: str) -> Any:
    """``value`` as a bool, int, float (an int is taken), str or Path; never a bool for a number."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value):
            value = float(value)  # YAML 1.1 reads 1e-20 (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(path, f"expected a path, got {value!r}")
        return Path(value)
    raise ConfigError(path, f"unsupported config type {_type_name(tp)}")


def check(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError(key, message) unless ``condition`` holds (for ``validate()``)."""
    if not condition:
        raise ConfigError(key, message)
