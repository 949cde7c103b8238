"""The layers point one way — bloomline ← data_prep ← training ← eval ← flows, each importing only
those to its left — and no module imports itself back through others. Every import counts,
those inside functions too."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["bloomline", "data_prep", "training", "eval", "flows"]


def modules() -> dict[str, Path]:
    out = {}
    for layer in LAYERS:
        for p in sorted((REPO / layer).rglob("*.py")):
            name = ".".join(p.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def imports(path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) of every import of one of ours in the file; ``from pkg import mod`` names ``pkg.mod``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            out += [(node.lineno, m) for m in subs] or [(node.lineno, node.module)]
    return [(line, m) for line, m in out if m.split(".")[0] in LAYERS]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for _, m in imports(p, known) if m in known and m != name} for name, p in known.items()}


def test_no_module_imports_a_layer_to_its_right():
    known = modules()
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    up = [f"{p.relative_to(REPO)}:{line} imports {m}" for name, p in known.items() for line, m in imports(p, known)
          if rank[m.split(".")[0]] > rank[name.split(".")[0]]]
    assert not up, up


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, [" → ".join(c) for c in cycles]


def test_the_checks_see_a_function_level_import(tmp_path):
    """The parser counts an import inside a function (where upward imports used to hide)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from flows.cli import main\n")
    assert imports(f, {"flows.cli": f}) == [(2, "flows.cli")]
