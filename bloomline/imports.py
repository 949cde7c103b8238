"""Which of bloomline's modules use which: one walk of the sources' syntax trees, read by the layer
test (tests/test_layers.py) and by the stages' code digests (flows/stages/reuse.py).

Every import counts, those inside functions too, and so does a string constant that names one of
our modules the way importlib, ``python -m`` and our registries do (``"training.config"``,
``"eval.tasks.xcopa:XCopa"``): code that loads a module by its name depends on it as much as code
with an import statement, and a layer test that cannot see such a string lets an upward dependency
through.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

LAYERS = ("bloomline", "data_prep", "training", "eval", "flows")
"""The packages, lowest first: each imports only those to its left."""
ROOMS = {
    "bloomline": (
        "errors", "io", "terminal", "host", "imports", "names", "owned", "secrets", "disk",
        "config", "languages", "tokenizer", "task_spec", "storage", "lease", "mirror",
    ),
    "data_prep": ("config", "steps", "inputs", "storage", "reports", "calibration", "passes", "dedup", "pipeline"),
    "training": ("config", "model", "parallel", "checkpoint", "hf", "planning", "data", "loop"),
    "eval": (
        "beside", "results", "model", "published", "generate", "tasks",
        "pages", "evaluate", "parallel", "publish", "harness",
    ),
    "flows": ("config", "run", "display", "stages", "serve", "cli"),
}  # fmt: skip
"""Within a package, its rooms, lowest first: each imports only itself and those to its left. A room
is a sub-package, or a module at the package's top.

bloomline: errors and plain files; the safety of names, caches and secrets; the recipes, languages,
tokenizers and task specs every stage shares; storage at a URL, its leases and mirrors.

data_prep: the recipe; the per-document steps; reading the inputs; what a run writes and where;
reports read back from it; where the shipped thresholds come from; the passes over the run folder;
the dedup pass; the driver that runs the passes in order.

training: the recipe; the model, single-device; the parallelism applied to it from outside; the run
folder and its checkpoints; Hugging Face in and out; what a layout costs; the data feed; the loop
that drives them all.

eval: where the evaluation beside training runs; contract 3 and its metrics; the model as tasks see
it, a published one, greedy decoding; the tasks; the pages; one process's evaluation; its tp·pp
ranks; the choice between the two and the publishing of results; lm-eval on an export.

flows: the main job's recipe; how a job runs as processes; what the user sees of it; the Prefect
flows of the stages; the server; the command line."""


def room(module: str) -> tuple[str, int] | None:
    """(package, rank) of a module's room in :data:`ROOMS`, None outside them (rank -1: in a package
    with rooms, but in none of them)."""
    parts = module.split(".")
    rooms = ROOMS.get(parts[0])
    if rooms is None or len(parts) < 2:
        return None
    return parts[0], rooms.index(parts[1]) if parts[1] in rooms else -1


def modules(repo: Path, packages: tuple[str, ...] = LAYERS) -> dict[str, Path]:
    """Dotted name → file of every module of ``packages`` (the layers by default; ``bench`` and
    ``tests`` are folders of modules too) under ``repo`` (a package by its name)."""
    out = {}
    for layer in packages:
        for p in sorted((repo / layer).rglob("*.py")):
            name = ".".join(p.relative_to(repo).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


@lru_cache(maxsize=8192)
def _parsed(path: Path, mtime_ns: int, size: int, packages: tuple[str, ...]) -> tuple[tuple[int, str, str], ...]:
    """(line, kind, name) of each import and module-like string in the file; cached by its stat."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, "import", a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, "from", f"{node.module}\0{a.name}") for a in node.names]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.split(".")[0] in packages
            and ("." in node.value or ":" in node.value)
        ):  # "eval" alone is a folder's name as often as a package's
            out.append((node.lineno, "string", node.value))
    return tuple(out)


def imports(path: Path, known: dict[str, Path], packages: tuple[str, ...] = LAYERS) -> list[tuple[int, str]]:
    """(line, module) of every use of one of our modules in the file: ``import a.b``, ``from a
    import b`` (names ``a.b`` when that is a module, else ``a``), and a string ``"a.b"`` or
    ``"a.b:Name"`` naming a module in ``known``."""
    st = path.stat()
    out = []
    for line, kind, name in _parsed(path, st.st_mtime_ns, st.st_size, packages):
        if kind == "import":
            out.append((line, name))
        elif kind == "from":
            module, _, attr = name.partition("\0")
            out.append((line, f"{module}.{attr}" if f"{module}.{attr}" in known else module))
        else:
            module = name.partition(":")[0]
            if module in known:
                out.append((line, module))
    return [(line, m) for line, m in out if m.split(".")[0] in packages]


def graph(repo: Path, packages: tuple[str, ...] = LAYERS) -> dict[str, set[str]]:
    """Module → the modules of ``packages`` it uses (itself left out)."""
    known = modules(repo, packages)
    return {name: {m for _, m in imports(p, known, packages) if m in known and m != name} for name, p in known.items()}


def closure(entries: Iterable[str], g: dict[str, set[str]], follow: Callable[[str], bool] = lambda m: True) -> set[str]:
    """``entries`` and every module they use, transitively, with the packages that importing each
    one runs (``a`` and ``a.b`` for ``a.b.c``); the walk leaves out the modules ``follow`` refuses
    (and what only they use)."""
    seen: set[str] = set()
    todo = list(entries)
    first = set(todo)
    while todo:
        m = todo.pop()
        if m in seen or m not in g or (m not in first and not follow(m)):
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(g[m])
    return seen
