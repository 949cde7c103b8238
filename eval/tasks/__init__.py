"""Evaluation tasks (the contract: eval/tasks/base.py). Adding one: a file here with its class,
and a line in ``REGISTRY``."""

from __future__ import annotations

from pathlib import Path

from bloomline.errors import ConfigError
from bloomline.task_spec import TaskSpec
from eval.results.rows import VALIDATION
from eval.tasks.base import Task

REGISTRY = {
    VALIDATION: "eval.tasks.validation:Validation",
    "continuation": "eval.tasks.continuation:Continuation",
    "xstorycloze": "eval.tasks.xstorycloze:XStoryCloze",
    "xcopa": "eval.tasks.xcopa:XCopa",
    "xnli": "eval.tasks.xnli:XNli",
    "xwinograd": "eval.tasks.xwinograd:XWinograd",
    "belebele": "eval.tasks.belebele:Belebele",
    "flores": "eval.tasks.flores:Flores",
}
"""Task name → ``module:class``, imported when a run asks for it."""


def make(spec: TaskSpec) -> Task:
    """The task ``spec`` names; a ConfigError naming the key for an unknown one or missing data."""
    import importlib

    where = REGISTRY.get(spec.name)
    if where is None:
        raise ConfigError("tasks", f"unknown task '{spec.name}' (known: {', '.join(sorted(REGISTRY))})")
    module, cls = where.split(":")
    task = getattr(importlib.import_module(module), cls)()
    if getattr(task, "needs_data", False) and not spec.data:
        raise ConfigError("tasks", f"task '{spec.name}' reads its items from a data folder: give it data: DIR")
    if spec.data and not Path(spec.data).is_dir():
        raise ConfigError("tasks", f"task '{spec.name}': data folder {spec.data} does not exist")
    return task


def check(specs: list[TaskSpec]) -> None:
    """Refuse unknown tasks, or tasks without their data, before anything runs."""
    for spec in specs:
        make(spec)


def validation_spec() -> TaskSpec:
    return TaskSpec(name=VALIDATION)


def data_digest(specs: list[TaskSpec]) -> dict[str, dict[str, str]]:
    """:func:`~bloomline.task_spec.folder_digest` of each task's data folder, by task name."""
    from bloomline.task_spec import folder_digest

    return {s.name: folder_digest(s.data) for s in specs if s.data and Path(s.data).is_dir()}
