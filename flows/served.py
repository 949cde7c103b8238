"""What a flow run that ``bloomline serve`` started may ask for.

Whoever can create a deployment run chooses its parameters, and the run executes them as the
user who serves. ``bloomline serve`` names the folders runs may use (``--root``) in the
environment its flow runs inherit (:data:`ROOTS_ENV`); under it, :func:`check` refuses, in one
line and before the run touches anything (flows/runlock.py ``owns`` calls it first):

- a setting that reaches beyond the machine or runs a program of the sender's choosing:
  ``dask.address`` (a Dask client unpickles what the scheduler sends back: whoever runs that
  scheduler runs code here), ``launch.launcher_args`` (arguments to ssh, pdsh, mpirun or srun),
  and ``launch.nccl`` variables naming a file NCCL reads or writes, a library or plugin it
  loads, or a search path (:data:`NCCL_REFUSED`: ``NCCL_NET_PLUGIN`` loads a shared library,
  ``NCCL_DEBUG_FILE`` and the ``*_DUMP_FILE`` ones write any path, ``NCCL_CONF_FILE`` reads more
  variables), or whose name or value could add a variable where DeepSpeed's launcher writes them
  one a line (a name beyond ``NCCL_[A-Z0-9_]``, a value with a line break or NUL);
- a path outside the roots: every string under a key that names a path in the flows'
  parameters and recipes (:data:`PATH_KEYS`; a new path setting must use one of these names or
  be added here), resolved as the flow would (relative to its working folder, symbolic links
  followed); for ``checkpoint``, its run folder, where ``evaluate`` writes by default. Recipes'
  values may also name the bundled recipes and sample corpus (read-only files of this package),
  and ``model`` a bundled model recipe by its name.

A run the ``bloomline`` command starts itself is not checked: :data:`ROOTS_ENV` is set only in
``bloomline serve``'s process and the flow runs it starts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from bloomline.errors import BloomlineError

ROOTS_ENV = "BLOOMLINE_SERVE_ROOTS"
"""The folders a served run may use: a JSON list of absolute paths (a folder's name may hold
``os.pathsep``)."""

REPO = Path(__file__).resolve().parents[1]
BUNDLED = (REPO / "configs", REPO / "data_prep" / "sample_corpus")
"""What the deployments' default parameters read: the bundled recipes and the sample corpus."""

PATH_KEYS = frozenset({"out", "data", "checkpoint", "path", "heldout", "reference", "hostfile", "model"})
"""The names paths go by: the flows' ``out``, ``data`` and ``checkpoint``; sources' ``path``,
tasks' ``data``, ``tokenizer.model``, ``evaluation.heldout``, ``online.reference``,
``launch.hostfile``, and the training recipe's ``model`` (a file, or a bundled recipe's name)."""

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")

NCCL_REFUSED = ("FILE", "CONF", "DUMP", "PLUGIN", "LIB", "PATH")
"""What an NCCL variable a served run sets may not have in its name: these name files NCCL reads
or writes, shared libraries it loads, or search paths (NCCL adds variables; a new one of these
kinds is refused unseen)."""
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")


def roots() -> list[Path] | None:
    """The roots ``bloomline serve`` gave its flow runs; None outside a served run."""
    value = os.environ.get(ROOTS_ENV)
    return [Path(r) for r in json.loads(value)] if value else None


def check(arguments: Mapping[str, Any]) -> None:
    """Refuse (:class:`BloomlineError`, naming the parameter) what a served run may not ask for
    (see the module's docstring); nothing outside a served run."""
    allowed = roots()
    if allowed is None:
        return
    _walk(arguments, "", allowed)


def _walk(node: Any, key: str, allowed: list[Path]) -> None:
    if isinstance(node, Mapping):
        for k, v in node.items():
            sub = f"{key}.{k}" if key else str(k)
            _refuse_setting(sub, str(k), v)
            if isinstance(v, str) and k in PATH_KEYS:
                _check_path(sub, str(k), v, allowed, in_recipe="." in sub)
            else:
                _walk(v, sub, allowed)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _walk(v, f"{key}[{i}]", allowed)


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


def _check_path(key: str, name: str, value: str, allowed: list[Path], in_recipe: bool) -> None:
    if not value:
        return
    if name == "model" and _NAME.fullmatch(value) and ".." not in value:
        return  # a bundled model recipe's name (training/config: configs/model/NAME.yaml)
    path = Path(os.path.realpath(value))
    if key == "checkpoint":  # evaluate writes to its run folder (RUN_DIR/checkpoints/step_N) unless given out
        path = path.parent.parent
    places = [*allowed, *BUNDLED] if in_recipe else allowed
    if not any(path.is_relative_to(p) for p in places):
        raise BloomlineError(
            f"parameter '{key}' refused: {path} is outside the folders bloomline serve was given "
            f"(--root: {', '.join(map(str, allowed))})"
        )
