"""What a flow run that ``bloomline serve`` started may ask for.

Whoever can create a deployment run chooses its parameters, and the run executes them as the
user who serves. ``bloomline serve`` names the folders runs may use (``--root``) in the
environment its flow runs inherit (:data:`ROOTS_ENV`); under it, :func:`check` refuses, in one
line and before the run touches anything (flows/run/runlock.py ``owns`` calls it first):

- a setting that reaches beyond the machine or runs a program of the sender's choosing:
  ``dask.address`` (a Dask client unpickles what the scheduler sends back: whoever runs that
  scheduler runs code here), ``launch.launcher_args`` (arguments to ssh, pdsh, mpirun or srun),
  and ``launch.nccl`` variables naming a file NCCL reads or writes, a library or plugin it
  loads, or a search path (:data:`NCCL_REFUSED`: ``NCCL_NET_PLUGIN`` loads a shared library,
  ``NCCL_DEBUG_FILE`` and the ``*_DUMP_FILE`` ones write any path, ``NCCL_CONF_FILE`` reads more
  variables), or whose name or value could add a variable where DeepSpeed's launcher writes them
  one a line (a name beyond ``NCCL_[A-Z0-9_]``, a value with a line break or NUL);
- a path outside the roots, or a URL not under a URL given as a root: every flow parameter and
  recipe setting typed :data:`bloomline.config.Location` (found from the types alone, so a new
  setting of that type cannot be forgotten: :func:`location_keys` lists them), a path resolved
  as the flow would (relative to its working folder, symbolic links followed); for
  ``checkpoint``, its run folder, where ``evaluate`` writes by default. Recipes' values may also
  name the bundled recipes and sample corpus (read-only files of this package), and ``model`` a
  bundled model recipe by its name.

A run the ``bloomline`` command starts itself is not checked: :data:`ROOTS_ENV` is set only in
``bloomline serve``'s process and the flow runs it starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Mapping

from bloomline import REPO
from bloomline.config import is_location, members
from bloomline.errors import BloomlineError
from bloomline.storage import is_url

ROOTS_ENV = "BLOOMLINE_SERVE_ROOTS"
"""The folders a served run may use: a JSON list of absolute paths (a folder's name may hold
``os.pathsep``)."""

SAMPLE_CORPUS = REPO / "data_prep" / "sample_corpus"
"""The bundled sample corpus (the demo recipes' input)."""
BUNDLED = (REPO / "configs", SAMPLE_CORPUS)
"""What the deployments' default parameters read: the bundled recipes and the sample corpus."""

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")

NCCL_REFUSED = ("FILE", "CONF", "DUMP", "PLUGIN", "LIB", "PATH")
"""What an NCCL variable a served run sets may not have in its name: these name files NCCL reads
or writes, shared libraries it loads, or search paths (NCCL adds variables; a new one of these
kinds is refused unseen)."""
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")


def roots() -> list[str] | None:
    """The roots ``bloomline serve`` gave its flow runs (folders, and URL prefixes); None outside a served run."""
    value = os.environ.get(ROOTS_ENV)
    return [str(r) for r in json.loads(value)] if value else None


def check(arguments: Mapping[str, Any], hints: Mapping[str, Any]) -> None:
    """Refuse (:class:`BloomlineError`, naming the parameter) what a served run may not ask for
    (see the module's docstring); nothing outside a served run. ``hints``: the flow's annotations
    with their extras (``typing.get_type_hints(fn, include_extras=True)``), which say which
    parameter is a location and which a recipe of which dataclass."""
    allowed = roots()
    if allowed is None:
        return
    for name, value in arguments.items():
        _walk(value, hints.get(name, Any), name, allowed, in_recipe=False)


def parameters_of(flow: Any) -> dict[str, Any]:
    """A flow's (or a flow function's) parameter annotations with their extras, for :func:`check`."""
    import inspect

    return typing.get_type_hints(inspect.unwrap(getattr(flow, "fn", flow)), include_extras=True)


def location_keys(cls: type, prefix: str = "") -> list[str]:
    """Every setting of recipe ``cls`` that names a path or a URL (typed :data:`Location`), dotted,
    ``[]`` for a list's items: what :func:`check` checks, derived from the types alone."""
    out = []
    for name, tp in typing.get_type_hints(cls, include_extras=True).items():
        key = f"{prefix}.{name}" if prefix else name
        if is_location(tp):
            out.append(key)
        for sub in members(tp):
            if dataclasses.is_dataclass(sub):
                out += location_keys(sub, key)
            elif typing.get_origin(sub) in (list, tuple):
                item = typing.get_args(sub)[0]
                if dataclasses.is_dataclass(item):
                    out += location_keys(item, key + "[]")
    return out


def _recipe(tp: Any) -> type | None:
    """The dataclass a flow parameter's mapping holds (``recipe_of(cls)``), or a dataclass type."""
    if typing.get_origin(tp) is Annotated:
        found = [m for m in typing.get_args(tp)[1:] if dataclasses.is_dataclass(m)]
        return found[0] if found else _recipe(typing.get_args(tp)[0])
    return next((m for m in members(tp) if dataclasses.is_dataclass(m)), None)


def _walk(node: Any, tp: Any, key: str, allowed: list[str], in_recipe: bool) -> None:
    """Check ``node``, of annotation ``tp``, at dotted ``key``: a location's value, a recipe's
    settings (each by its field's type), a list's items, a mapping's values."""
    if isinstance(node, str):
        if is_location(tp):
            _check_path(key, key.rsplit(".", 1)[-1], node, allowed, in_recipe)
        return
    if isinstance(node, Mapping):
        cls = _recipe(tp)
        if cls is not None:
            hints = typing.get_type_hints(cls, include_extras=True)
            for k, v in node.items():
                sub = f"{key}.{k}"
                _refuse_setting(sub, str(k), v)
                _walk(v, hints.get(str(k), Any), sub, allowed, in_recipe=True)
            return
        for k, v in node.items():
            args = [typing.get_args(m) for m in members(tp) if typing.get_origin(m) is dict]
            _refuse_setting(f"{key}.{k}", str(k), v)
            _walk(v, args[0][1] if args else Any, f"{key}.{k}", allowed, in_recipe)
        return
    if isinstance(node, (list, tuple)):
        items = [typing.get_args(m)[0] for m in members(tp) if typing.get_origin(m) in (list, tuple)]
        for i, v in enumerate(node):
            _walk(v, items[0] if items else Any, f"{key}[{i}]", allowed, in_recipe)


def _refuse_setting(key: str, name: str, value: Any) -> None:
    parent = key.split(".")[-2] if "." in key else ""
    why = None
    if parent == "dask" and name == "address" and value:
        why = "a served run prepares on its own local cluster, not on a scheduler it is sent"
    elif parent == "launch" and name == "launcher_args" and value:
        why = "a served run passes no arguments to ssh, pdsh, mpirun or srun"
    elif parent == "nccl" and (
        not _NCCL_NAME.fullmatch(name) or any(w in name for w in NCCL_REFUSED) or re.search(r"[\r\n\0]", str(value))
    ):
        why = (
            "a served run sets no NCCL variable naming a file, library, plugin or path, "
            "and none with a line break in its name or value"
        )
    if why:
        raise BloomlineError(f"parameter '{key}' refused: {why} (bloomline serve)")


def _check_path(key: str, name: str, value: str, allowed: list[str], in_recipe: bool) -> None:
    if not value:
        return
    if name == "model" and _NAME.fullmatch(value) and ".." not in value:
        return  # a bundled model recipe's name (training/config: configs/model/NAME.yaml)
    given = ", ".join(allowed)
    if is_url(value):
        # a URL only under a URL given as --root, and no '..' or '.' part to step out of it
        parts = value.split("://", 1)[1].split("/")
        inside = any(
            value.rstrip("/") == r.rstrip("/") or value.startswith(r.rstrip("/") + "/") for r in allowed if is_url(r)
        )
        if not inside or any(p in (".", "..") for p in parts):
            raise BloomlineError(
                f"parameter '{key}' refused: {value} is not under a URL bloomline serve was given (--root: {given})"
            )
        return
    path = Path(os.path.realpath(value))
    if key == "checkpoint":  # evaluate writes to its run folder (RUN_DIR/checkpoints/step_N) unless given out
        path = path.parent.parent
    places = [*(Path(r) for r in allowed if not is_url(r)), *(BUNDLED if in_recipe else ())]
    if not any(path.is_relative_to(p) for p in places):
        raise BloomlineError(
            f"parameter '{key}' refused: {path} is outside the folders bloomline serve was given (--root: {given})"
        )
